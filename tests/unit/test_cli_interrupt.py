"""Ctrl-C at any moment of a CLI command ends it with exit 130 and no traceback."""

from __future__ import annotations

import asyncio
import importlib

import pytest

import harness.cli as cli


def test_ctrl_c_while_the_commands_module_loads_is_exit_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The subcommand's module is imported after main() starts (a quarter of a second for
    # `harness sessions`): a Ctrl-C then used to print the import's whole traceback.
    real_import = importlib.import_module

    def interrupted(name: str, *args: object) -> object:
        if name.startswith("harness.cli.sessions"):
            raise KeyboardInterrupt
        return real_import(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main(["sessions", "--log", "sqlite:///nowhere.db"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err == "\n"


class _SqliteLikeLog:
    """A log without check_reachable: the guard awaits the work itself."""


class _KafkaLikeLog:
    async def check_reachable(self, timeout: float) -> None:
        return None


@pytest.mark.parametrize("log", [_SqliteLikeLog(), _KafkaLikeLog()], ids=["sqlite", "kafka"])
def test_ctrl_c_before_a_guarded_read_starts_leaves_no_coroutine_unawaited(log: object) -> None:
    # `harness sessions` runs guard(telling_if_slow(list_sessions(...))). A Ctrl-C arriving
    # while the command's own code ran (asyncio.run's handler cancels the main task in the
    # middle of its step) cancelled the inner task before its first step, and Python printed
    # "RuntimeWarning: coroutine 'list_sessions' was never awaited" under the Ctrl-C line.
    import gc
    import warnings

    from harness.cli.common import BrokerWatch, telling_if_slow

    async def list_sessions() -> list[str]:
        return []

    async def command() -> list[str]:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # what the SIGINT handler of asyncio.run does
        return await BrokerWatch(log).guard(telling_if_slow(list_sessions(), after=10, note=""))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(command())
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
