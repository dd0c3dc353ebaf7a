"""scaling.plan.layout: a layout's text form and its checks."""

import pytest

from scaling.errors import ConfigError
from scaling.plan.layout import parse_step_layout


def test_overlap_flags_bad_input():
    for text, key in (("tp=8,tpo=2", "layout.tpo"), ("tp=1,tpo=1", "layout.tpo"), ("tp=2,ogr=yes", "layout")):
        with pytest.raises(ConfigError) as e:
            parse_step_layout(text)
        assert e.value.key == key, text
