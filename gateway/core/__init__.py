"""The protocol-neutral core: the call and answer types, the backend contract, the dataplane
(find, authenticate, admit, dispatch), errors, authentication, admission, the run state and
the logging every process shares. It knows no wire format and no web framework route."""
