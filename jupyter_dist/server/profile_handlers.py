"""``/profiles``: the launcher profiles of the server's Jupyter config folder, each with
the session request it makes (what the sidebar's form fills in), and ``/profiles/NAME``:
save a request as a profile. ``POST /sessions`` takes a ``profile`` too
(`profile_requests.with_profile`). The file is read and written in a thread: a slow file
system holds up that request only."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_dist.common.profiles import (
    Profile,
    check_name,
    launcher_of,
    profiles_path,
    read_profiles,
    write_profile,
)
from jupyter_dist.common.spec import validate_request
from jupyter_dist.common.wire_names import API_PREFIX
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import (
    FILE_CHECK_S,
    DistHandler,
    check_files,
    maps_errors,
    shape_from_json,
)
from jupyter_dist.server.profile_requests import request_of, settings_of, with_profile


def listed(profile: Profile) -> dict[str, Any]:
    """One profile as ``GET /profiles`` lists it; ``error`` says what a start from it
    would refuse ("" when nothing)."""
    entry: dict[str, Any] = {
        "name": profile.name,
        "launcher": profile.launcher,
        "settings": profile.settings,
        "request": {},
        "unused": [],
        "error": "",
    }
    try:
        entry["request"], entry["unused"] = request_of(profile)
        shape_from_json(entry["request"])  # its values: a request may give the rest
    except SpecError as err:
        entry["error"] = str(err)
    return entry


async def in_thread(call: Any, *args: Any) -> Any:
    """``call(*args)`` in a thread, within `FILE_CHECK_S`."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(call, *args), FILE_CHECK_S)
    except asyncio.TimeoutError:
        raise SpecError(
            f"{profiles_path()}: the file system did not answer within {FILE_CHECK_S:.0f} s"
        ) from None


class ProfilesHandler(DistHandler):
    """``GET /profiles``: the file, and its profiles in its order."""

    @web.authenticated
    @authorized
    @maps_errors
    async def get(self) -> None:
        path: Path = await in_thread(profiles_path)
        try:
            profiles = await in_thread(read_profiles, path)
            error = ""
        except SpecError as err:
            profiles, error = {}, str(err)
        self.reply(
            {
                "path": str(path),
                "profiles": [listed(p) for p in profiles.values()],
                "error": error,
            }
        )


class ProfileHandler(DistHandler):
    """``PUT /profiles/NAME``: the body, a session request as ``POST /sessions`` takes it
    (a ``profile`` in it applied, so what the form has no field for is kept), checked as a
    start checks it, saved as profile NAME (replacing one of that name).

    A profile says what programs a start runs (``python``, an image): saving one needs the
    permission starting one needs, ``execute``."""

    @web.authenticated
    @authorized("execute")  # type: ignore[untyped-decorator]
    @maps_errors
    async def put(self, name: str) -> None:
        check_name(name, "profiles")
        body = self.json_body()
        if not isinstance(body, dict):
            raise SpecError("expected a JSON object: the session request to save as a profile")
        body = await with_profile(body)  # what the form has no field for comes along
        req = shape_from_json(body)
        await check_files(req)
        validate_request(req.shape)
        settings = settings_of(body)
        path = await in_thread(write_profile, name, settings)
        profile = Profile(name, path, settings)
        self.reply({**listed(profile), "path": str(path), "launcher": launcher_of(settings)})


_PROFILE = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
PROFILE_HANDLERS = [
    (rf"{API_PREFIX}/profiles", ProfilesHandler),
    (rf"{API_PREFIX}/profiles/{_PROFILE}", ProfileHandler),
]

__all__ = ["PROFILE_HANDLERS", "ProfileHandler", "ProfilesHandler"]
