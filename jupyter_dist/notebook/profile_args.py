"""``%%distributed --profile NAME``: a profile's fields are the defaults of the cell's
options, and what the cell gives overrides them.

Each field is read by the cell's own parser (``--nodes``'s type, ``--k8s``'s switch), one
field at a time, so a value it refuses is named by file, profile and field rather than by
a flag the user never typed; what is checked later (`DistMagics._shape`: counts, the
launcher's options, files) is named so by `in_profile_words`. The options known are the
parser's: an option the magic gains is a profile field at once.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from IPython.core.error import UsageError

from jupyter_dist.common.profiles import Profile, find_profile, options_of
from jupyter_dist.errors import SpecError

#: options of which the cell giving one replaces the profile's other too
TOGETHER: tuple[frozenset[str], ...] = (frozenset({"gpus", "procs"}),)
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class ProfileUse:
    """The profile a cell used, and the options its fields gave the cell (by flag: the
    field), those the cell overrode left out."""

    profile: Profile
    gave: dict[str, str] = field(default_factory=dict)


def apply_profile(
    parser: argparse.ArgumentParser, args: argparse.Namespace, path: Path | None = None
) -> ProfileUse:
    """Fill ``args`` (the cell's, parsed) with profile ``args.profile``'s fields where the
    cell left an option at its default; what was taken, for `in_profile_words`."""
    profile = find_profile(args.profile, path)
    kinds = options_of(parser)
    profile.check_fields(kinds)
    defaults = parser.parse_args([])
    given = {
        dest
        for dest, value in vars(args).items()
        if dest in vars(defaults) and value != getattr(defaults, dest)
    }
    for group in TOGETHER:
        if given & {f.replace("-", "_") for f in group}:
            given |= {f.replace("-", "_") for f in group}
    use = ProfileUse(profile)
    for name, kind in kinds.items():
        if name not in profile.settings:
            continue
        words = profile.argv(name, kind)
        try:
            parsed = parser.parse_args(words)
        except (UsageError, SystemExit) as err:
            said = str(err).removeprefix("argument ")
            raise SpecError(f"{profile.where(name)}: {said}") from None
        for dest, value in vars(parsed).items():
            if value == getattr(defaults, dest) or dest in given:
                continue
            setattr(args, dest, value)
            use.gave[f"--{name}"] = name
    return use


def in_profile_words(err: SpecError, use: ProfileUse | None) -> SpecError:
    """``err`` told of the profile when it names an option the profile gave: ``FILE:
    profile 'gpu', field 'gpus': --gpus x: ...``."""
    if use is None:
        return err
    message = str(err)
    fields = [use.gave[f] for f in dict.fromkeys(_FLAG.findall(message)) if f in use.gave]
    if not fields:
        return err
    where = use.profile.where(fields[0]) if len(fields) == 1 else use.profile.where()
    if len(fields) > 1:
        where += f", fields {', '.join(repr(f) for f in fields)}"
    return SpecError(f"{where}: {message}")


__all__ = ["ProfileUse", "apply_profile", "in_profile_words"]
