"""The samples' filter on multi-turn episodes (`Repository.list_samples`), in SQL on the
episode columns (NULL for a single turn)."""

from dataclasses import dataclass

from sqlalchemy import ColumnElement

from db.enums import EpisodeFinish, coerce
from db.errors import InvalidValue
from db.models import Sample


@dataclass(frozen=True)
class EpisodeFilter:
    """Filters of `Repository.list_samples` on multi-turn episodes; None or False: any sample,
    single turns included. ``episode_finish`` keeps the episodes that ended so, ``min_turns``
    those of at least that many assistant turns, ``with_tool_errors`` those with a turn whose
    tool call could not be parsed."""

    episode_finish: EpisodeFinish | str | None = None
    min_turns: int | None = None
    with_tool_errors: bool = False


ANY_EPISODE = EpisodeFilter()


def episode_conditions(episode: EpisodeFilter) -> list[ColumnElement[bool]]:
    """The conditions of ``episode`` on the samples' episode columns."""
    conditions = []
    if episode.episode_finish is not None:
        finish = coerce(EpisodeFinish, episode.episode_finish, "episode_finish")
        conditions.append(Sample.episode_finish == finish.value)
    if episode.min_turns is not None:
        if not isinstance(episode.min_turns, int) or isinstance(episode.min_turns, bool):
            raise InvalidValue(f"min_turns: {episode.min_turns!r} is not a whole number")
        conditions.append(Sample.turns >= episode.min_turns)
    if episode.with_tool_errors:
        conditions.append(Sample.tool_errors > 0)
    return conditions
