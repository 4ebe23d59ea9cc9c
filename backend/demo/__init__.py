"""``vigil demo``: Vigil embedded, a real faulty training job diagnosed and healed on screen
(:mod:`backend.demo.story`); ``--replay`` replays a real recorded job instead
(:mod:`backend.demo.replay`)."""

from backend.demo.replay import run_replay
from backend.demo.story import run_story

__all__ = ["run_replay", "run_story"]
