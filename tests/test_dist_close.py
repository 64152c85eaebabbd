"""A run leaves its process group at the end (``policyzoo.engine.dist.close``): a gloo group left to the
interpreter's exit aborted a finished rank once ("terminate called without an active exception", CI of
2026-12-04, tests/test_sync_streamed.py), and torchrun then reported the run as failed."""

from __future__ import annotations

import pytest
import torch.distributed as tdist

from policyzoo.engine import dist
from policyzoo.engine.run import train
from policyzoo.errors import UserError


def test_close_destroys_the_group_and_is_a_no_op_without_one(tmp_path, monkeypatch):
    dist.close()  # no group, one rank: nothing to do, no error
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under a launcher (dist.* act only for more than one rank)
    assert tdist.is_initialized()
    dist.close()
    assert not tdist.is_initialized()
    dist.close()  # a second call finds nothing to leave


@pytest.mark.parametrize("fails", [False, True])
def test_a_run_leaves_the_group_when_it_ends_or_fails(monkeypatch, fails):
    closed = []

    class Done:
        def train(self):
            if fails:
                raise UserError("here", "why", "fix")
            return {"steps": 2}

    monkeypatch.setattr(train, "open_run", lambda *a, **k: Done())
    monkeypatch.setattr(dist, "close", lambda: closed.append(True))
    if fails:
        with pytest.raises(UserError):
            train.main(object())
    else:
        assert train.main(object()) == {"steps": 2}
    assert closed == [True]
