"""The deployed functions' settings from their environment: a bad number fails at start naming its variable."""

from __future__ import annotations

import pytest
from xdiag.cloud.runtime import CloudConfig

BASE = {"GOOGLE_CLOUD_PROJECT": "p", "XDIAG_BUCKET": "gs://b"}


def test_the_settings_read_their_numbers_with_the_defaults_types():
    config = CloudConfig.from_env({**BASE, "XDIAG_MAX_PROFILE_GIB": "0.5", "XDIAG_MAX_HOSTS": " 8 ",
                                   "XDIAG_QUIET_PERIOD_S": "", "XDIAG_CAPTURE_ATTEMPTS": "2"})
    assert config.max_profile_bytes == 2**29 and config.max_hosts == 8 and config.capture.attempts == 2
    assert config.quiet_period_s == CloudConfig.quiet_period_s  # empty: the default
    assert CloudConfig.from_env(BASE).max_profile_bytes == 2 * 2**30


@pytest.mark.parametrize("name, value, said", [
    ("XDIAG_MAX_PROFILE_GIB", "2GB", "XDIAG_MAX_PROFILE_GIB='2GB': not a number of 0 or more"),
    ("XDIAG_MAX_PROFILE_GIB", "inf", "XDIAG_MAX_PROFILE_GIB='inf': not a number"),
    ("XDIAG_CACHE_GIB", "nan", "XDIAG_CACHE_GIB='nan': not a number"),
    ("XDIAG_QUIET_PERIOD_S", "-1", "XDIAG_QUIET_PERIOD_S='-1': not a number of 0 or more"),
    ("XDIAG_MAX_HOSTS", "2.5", "XDIAG_MAX_HOSTS='2.5': not a whole number of 0 or more"),
])
def test_a_setting_that_is_no_number_names_its_variable(name, value, said):
    with pytest.raises(ValueError) as refused:
        CloudConfig.from_env({**BASE, name: value})
    assert said in str(refused.value)
