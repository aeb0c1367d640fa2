"""The error contract's one check, shared by the test modules that list bad calls: the call raises
``error`` and its message says ``words`` (the argument's name, and the shapes or values it saw)."""
import pytest


def check_bad_input(name: str, call, error: type[Exception], words: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value), f"{name}: the message does not say {words!r}: {info.value}"
