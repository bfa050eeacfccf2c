"""KVQuantSpec validation: one-line QuantErrors with did-you-mean hints."""

from __future__ import annotations

import pytest

from quant.errors import QuantError
from quant.kv_spec import kv_spec_from_dict


def test_spec_validation_errors_are_one_line_quant_errors():
    with pytest.raises(QuantError, match="did you mean 'nvfp4'"):
        kv_spec_from_dict({"format": "nvfp"})
    with pytest.raises(QuantError, match="recent_window"):
        kv_spec_from_dict({"recent_window": -1})
    with pytest.raises(QuantError, match="unknown key 'formt'; did you mean 'format'"):
        kv_spec_from_dict({"formt": "nvfp4"})
    with pytest.raises(QuantError, match="constant_scale"):
        kv_spec_from_dict({"scales": "constant"})
    with pytest.raises(QuantError, match="block-scaled"):
        kv_spec_from_dict({"format": "fp8_e4m3", "v_scale_layout": "reversed"})
