"""Driver run under the reference interpreter (.venv-eas, eas-prediction 0.36).

Reads a JSON list of cases on stdin and writes one JSON result per case. Values use a
small tagged encoding shared with ``refcases.py``: ``{"$b": hex}`` is bytes,
``{"$np": [dtype, nested list]}`` is a numpy array. Each case is a list whose first item
names it:

* ``["tf", signature_or_null, ops]`` with ops ``["feed", name, shape, dt, content]``,
  ``["fetch", name]``, ``["sig", name]``
* ``["torch", flag, ops]`` with ``["feed", i, shape, dt, content]``,
  ``["feed_map", key, shape, dt, content]``, ``["fetch", i]``, ``["debug", level]``
* ``["blade", signature, ops]`` with ``["feed", name, batch, shape, dt, content]``, ``["fetch", name, dt]``
* ``["blade_tf", signature, ops]`` (blade_tf_request.TFRequest) with ``["feed", name, shape, dt, content]``,
  ``["fetch", name]``
* ``["string", data]``
* ``["tf_resp", [[name, dt, dims, field, values], ...], [query names]]``
* ``["torch_resp", [[dt, dims, field, values], ...], [[key, dt, dims, field, values], ...]]``
* ``["blade_resp", [[name, batch, dims, field, values], ...], [[name, dt], ...]]``

Result: ``{"hex": ...}`` (request bytes or built response bytes) plus, for responses, the
reference's ``get_values``/``get_tensor_shape`` answers; or ``{"err": ExceptionTypeName}``.
"""

import json
import sys

import numpy as np
from eas_prediction import (
    BladeRequest,
    BladeResponse,
    StringRequest,
    TFRequest,
    TFResponse,
    TorchRequest,
    TorchResponse,
    blade_pb2,
    blade_tf_request,
)
from eas_prediction import pytorch_predict_pb2 as pt_pb
from eas_prediction import tf_request_pb2 as tf_pb


def dec(obj):
    if isinstance(obj, dict):
        if "$b" in obj:
            return bytes.fromhex(obj["$b"])
        if "$np" in obj:
            dtype, data = obj["$np"]
            if dtype == "bytes":
                return np.array([bytes.fromhex(x) for x in data], dtype=object)
            return np.array(data, dtype=dtype)
        return {k: dec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [dec(v) for v in obj]
    return obj


def enc(obj):
    if obj is None:
        return None
    if isinstance(obj, bytes):
        return {"$b": obj.hex()}
    if isinstance(obj, (list, tuple)) or (hasattr(obj, "__iter__") and not isinstance(obj, (str, dict))):
        return [enc(v) for v in obj]
    return obj


def fill(arr, field, values):
    getattr(arr, field).extend(values)


def run(case):
    kind = case[0]
    if kind == "tf":
        req = TFRequest(case[1]) if case[1] is not None else TFRequest()
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
            elif op[0] == "sig":
                req.set_signature_name(op[1])
        return {"hex": req.to_string().hex()}
    if kind == "torch":
        req = TorchRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "feed_map":
                req.add_feed_map(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
            elif op[0] == "debug":
                req.set_debug_level(op[1])
        return {"hex": req.to_string().hex()}
    if kind == "blade":
        req = BladeRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], op[4], dec(op[5]))
            elif op[0] == "fetch":
                req.add_fetch(op[1], op[2])
        return {"hex": req.to_string().hex()}
    if kind == "blade_tf":
        req = blade_tf_request.TFRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
        return {"hex": req.to_string().hex()}
    if kind == "string":
        data = StringRequest(dec(case[1])).to_string()
        return {"hex": (data.encode("utf-8") if isinstance(data, str) else data).hex()}
    if kind == "tf_resp":
        msg = tf_pb.PredictResponse()
        for name, dt, dims, field, values in case[1]:
            out = msg.outputs[name]
            out.dtype = dt
            out.array_shape.dim.extend(dims)
            fill(out, field, dec(values))
        body = msg.SerializeToString()
        resp = TFResponse(body)
        answers = {q: [enc(resp.get_values(q)), resp.get_tensor_shape(q)] for q in case[2]}
        return {"hex": body.hex(), "answers": answers}
    if kind == "torch_resp":
        msg = pt_pb.PredictResponse()
        for dt, dims, field, values in case[1]:
            out = msg.outputs.add()
            out.dtype = dt
            out.array_shape.dim.extend(dims)
            fill(out, field, dec(values))
        for key, dt, dims, field, values in case[2]:
            out = msg.map_outputs[key]
            out.dtype = dt
            out.array_shape.dim.extend(dims)
            fill(out, field, dec(values))
        body = msg.SerializeToString()
        resp = TorchResponse(body)
        pos = [[enc(resp.get_values(i)), resp.get_tensor_shape(i)] for i in range(len(case[1]))]
        maps = {k[0]: [enc(resp.get_values_map(k[0])), resp.get_tensor_shape_map(k[0])] for k in case[2]}
        return {"hex": body.hex(), "answers": {"pos": pos, "map": maps}}
    if kind == "blade_resp":
        msg = blade_pb2.Response()
        for name, batch, dims, field, values in case[1]:
            out = msg.outputs.add()
            out.name_in_dl_model = name
            out.blade_blob_name = name
            out.batchsize = batch
            out.shape.dim.extend(dims)
            fill(out, field, dec(values))
        body = msg.SerializeToString()
        resp = BladeResponse(body)
        answers = [[enc(list(resp.get_values(n, dt))), resp.get_tensor_shape(n)] for n, dt in case[2]]
        tf_resp = blade_tf_request.TFResponse(body)
        tf_answers = [enc(list(tf_resp.get_values(n))) for n, _ in case[2]]
        return {"hex": body.hex(), "answers": answers, "tf_answers": tf_answers}
    raise ValueError(kind)


def main():
    cases = json.loads(sys.stdin.read())
    results = []
    for case in cases:
        try:
            results.append(run(case))
        except Exception as exc:  # the reference failing is a result too
            results.append({"err": type(exc).__name__, "msg": str(exc)[:200]})
    sys.stdout.write(json.dumps(results))


main()
