"""The switch interval an in-process CUDA loader lowers while it runs (`ingest.pipeline.SwitchInterval`)."""

import sys

import pytest

from ingest import defaults
from ingest.pipeline import SwitchInterval


@pytest.fixture
def interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(old)


def test_lowered_while_held_and_restored_after_the_last_user(interval):
    si = SwitchInterval()
    with defaults.set(switch_interval_us=500):
        si.acquire()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        si.acquire()   # a second loader
        si.release()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        si.release()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_never_raised_and_zero_leaves_it(interval):
    si = SwitchInterval()
    sys.setswitchinterval(0.0001)
    with defaults.set(switch_interval_us=500):
        si.acquire()
        assert sys.getswitchinterval() == pytest.approx(0.0001)
        si.release()
    sys.setswitchinterval(0.005)
    with defaults.set(switch_interval_us=0):
        si.acquire()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        si.release()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_value_the_program_set_meanwhile_is_kept(interval):
    si = SwitchInterval()
    with defaults.set(switch_interval_us=500):
        si.acquire()
        sys.setswitchinterval(0.002)
        si.release()
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_setting_is_validated():
    from ingest.errors import ConfigError
    with pytest.raises(ConfigError, match="switch_interval_us"):
        defaults.set(switch_interval_us=-1)
