"""Wire codecs: each wire format the SDK and the gateway speak gets one module or subpackage here.

``eas`` is the EAS predict protobuf family (TF, Torch, Blade) with the gateway's JSON form;
other formats join as siblings, so a format is encoded and decoded in exactly one place.
"""
