"""Which launch (run) a collector reports for, and how it says goodbye (issue 17).

The run key rides in every batch header (``run``): ``vigil run``'s ``VIGIL_RUN_ID``, else
torchrun's ``TORCHELASTIC_RUN_ID`` (not ``none``), else ``SLURM_JOB_ID``; a lone process
outside any launcher is its own run. The goodbye carries the exit code when it is known.
"""

from __future__ import annotations

from typing import Any

from backend.launch import child_env
from collector.client import Client
from collector.config import Config
from collector.shipper import Shipper
from collector.transport import Outcome

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}


def run_of(**environ: str) -> str | None:
    return Config.resolve(environ=environ).run


def test_the_run_key_comes_from_the_launcher():
    assert run_of(**TORCHRUN, VIGIL_RUN_ID="v-1", TORCHELASTIC_RUN_ID="t-1") == "v-1"
    assert run_of(**TORCHRUN, TORCHELASTIC_RUN_ID="3f2c-uuid") == "3f2c-uuid"
    assert run_of(**TORCHRUN, TORCHELASTIC_RUN_ID="none", SLURM_JOB_ID="4242") == "4242"
    assert run_of(**TORCHRUN, TORCHELASTIC_RUN_ID="none") is None  # the server decides


def test_a_lone_process_is_a_run_of_its_own():
    first, second = run_of(), run_of()
    assert first and second and first.split("-")[-2] == second.split("-")[-2]  # same pid


def test_torchruns_run_id_names_the_run_not_the_job():
    cfg = Config.resolve(environ={**TORCHRUN, "TORCHELASTIC_RUN_ID": "3f2c"})
    assert (cfg.job, cfg.run) == ("default", "3f2c")


def test_vigil_run_gives_each_launch_its_own_run_id():
    a = child_env(["python", "train.py"], endpoint="http://v", token="", job="j", chaos=None)
    b = child_env(["python", "train.py"], endpoint="http://v", token="", job="j", chaos=None)
    assert a["VIGIL_RUN_ID"] and a["VIGIL_RUN_ID"] != b["VIGIL_RUN_ID"]
    kept = child_env(
        ["python", "train.py"],
        endpoint="http://v",
        token="",
        job="j",
        chaos=None,
        base={"VIGIL_RUN_ID": "mine"},
    )
    assert kept["VIGIL_RUN_ID"] == "mine"


class Recording:
    """A transport that keeps what it is given and answers that it was stored."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def send(self, body: dict[str, Any]) -> Outcome:
        self.bodies.append(body)
        return Outcome(delivered=True)


def test_every_batch_names_its_run():
    cfg = Config.resolve(endpoint="http://v", environ={**TORCHRUN, "VIGIL_RUN_ID": "r-7"})
    transport = Recording()
    shipper = Shipper(cfg, transport, drop=lambda *_: None, on_actions=lambda _: None)  # type: ignore[arg-type]
    shipper.add({"type": "metric", "name": "x", "value": 1.0})
    shipper.send(flushing=True)
    assert [b["run"] for b in transport.bodies] == ["r-7"]


def goodbye(exit_code: int | None = None) -> dict[str, Any]:
    cfg = Config.resolve(endpoint="http://v", environ=TORCHRUN)
    transport = Recording()
    client = Client(cfg, transport=transport)  # type: ignore[arg-type]
    client.shutdown(2.0, exit_code=exit_code)
    beats = [e for b in transport.bodies for e in b["events"] if e["type"] == "heartbeat"]
    assert beats and beats[-1]["exiting"] is True
    return beats[-1]


def test_the_goodbye_carries_the_exit_code_when_known():
    assert goodbye(exit_code=3)["exit_code"] == 3
    assert "exit_code" not in goodbye()  # a plain exit: not known, taken as clean
