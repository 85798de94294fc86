from tests.e2e.conftest import digits_model
from tests.e2e.gateway_proc import gateway_factory

__all__ = ["digits_model", "gateway_factory"]
