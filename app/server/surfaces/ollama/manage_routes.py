"""Ollama's model management: /api/pull, /api/delete, /api/copy, /api/create, on the library and the hub.

- pull `hf.co/ORG/REPO[:QUANT]`: a download job of the DownloadManager (resumable, verified by sha256,
  into the HF cache), followed as Ollama's progress NDJSON; the pulled name becomes an alias of the model.
  A client that goes away stops following, never the download (another client may wait on the same job).
- delete: an alias loses only its name (a pulled name takes its model along, as in Ollama); a model is
  removed as `switchyard rm` does, refused while a lane has it loaded.
- copy, and create `from` a model: an alias (library.db), listed in /api/tags, usable on every API.
- create from a local GGUF path: a copied import, as `switchyard import PATH --name NAME`.

These are admin routes (app/server/auth.py): they answer only on this machine unless allow_remote_admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from app.core.errors import (
    BadRequestError,
    DownloadError,
    ModelInUseError,
    ModelNotFoundError,
    SwitchyardError,
)
from app.core.events import Event
from app.hub.download import ACTIVE, Job
from app.hub.quant import is_projector
from app.hub.selection import fetch_commit, select
from app.hub.transfer import FileSpec
from app.lanes.lane import LaneState
from app.library.catalog import ModelEntry
from app.library.importer import import_model
from app.library.remove import remove_model
from app.runtime import Runtime
from app.server.keys import RUNTIME
from app.server.request_keys import MODEL
from app.server.surfaces.ollama.manage import (
    PullRef,
    alias_name,
    is_local_path,
    layer,
    modelfile_source,
    parse_pull_name,
    refuse_unsupported,
)
from app.server.surfaces.ollama.routes import resolve
from app.server.surfaces.ollama.translate import candidate_ids, require_model, stream_flag
from app.server.surfaces.openai.validate import parse_body
from app.server.surfaces.wire import ndjson

log = logging.getLogger("switchyard.ollama")
routes = web.RouteTableDef()
_LOADED = (LaneState.STARTING, LaneState.READY, LaneState.STOPPING)


# ---- names ---------------------------------------------------------------------------------------
def _alias(rt: Runtime, name: str) -> tuple[str, dict[str, Any]] | None:
    """(alias, its record) for an Ollama name (`x`, `x:latest`); tags compare without case, as lookups do."""
    aliases = rt.library.aliases()
    for cand in candidate_ids(name):
        for alias, doc in aliases.items():
            if alias == cand or (":" in cand and alias.lower() == cand.lower()):
                return alias, doc
    return None


def _taken(rt: Runtime, name: str) -> bool:
    rt.catalog.scan()  # a file may have arrived since the last scan
    for cand in candidate_ids(name):
        try:
            if rt.catalog.find(cand) is not None:
                return True
        except ModelNotFoundError:  # it names several models: taken all the more
            return True
    return False


def _refuse_taken(rt: Runtime, name: str, *, param: str) -> None:
    if _taken(rt, name):
        raise BadRequestError(
            f"a model named {name!r} exists already; choose another name, or delete it first "
            "(DELETE /api/delete)",
            param=param,
        )


def _refuse_loaded(rt: Runtime, entry: ModelEntry, name: str) -> None:
    for lane in rt.supervisor.lanes.values():
        if lane.model_id == entry.id and (lane.state in _LOADED or lane.in_flight > 0):
            raise ModelInUseError(
                f"model {name!r} is loaded in lane {lane.id!r} ({lane.state}); unload it first: a request "
                f'with "keep_alive": 0 (POST /api/generate {{"model": "{name}", "keep_alive": 0}}) or '
                f"POST /api/models/{entry.id}/unload, then delete it",
                param="model",
            )


# ---- pull ----------------------------------------------------------------------------------------
def _check_gguf(rt: Runtime, ref: PullRef) -> list[FileSpec]:
    """The files the pull will fetch, resolved before anything streams (unknown repo or quant: a 4xx)."""
    rc = fetch_commit(rt.downloads.config(), ref.repo)
    files = select(rc, ref.quant, spell=lambda repo, quant: f"hf.co/{repo}:{quant}")  # Ollama's naming
    if not any(f.path.lower().endswith(".gguf") and not is_projector(f.path) for f in files):
        raise BadRequestError(
            f"hf.co/{ref.repo} has no GGUF model files; Ollama clients pull GGUF repositories only "
            f"(`switchyard pull {ref.repo}` downloads other formats)",
            param="model",
        )
    return files


async def _follow(q: asyncio.Queue[Event], job: Job, send: Any) -> None:
    """Progress lines for `job` until it leaves the queue: from its events, and its state checked each
    second (the bus drops the oldest events of a slow subscriber, the end included)."""
    by_path = {f.path: f for f in job.files}
    while job.state in ACTIVE:
        try:
            ev = await asyncio.wait_for(q.get(), 1.0)
        except TimeoutError:
            continue
        if ev.data.get("id") != job.id or ev.kind != "download.progress":
            continue
        f = by_path.get(ev.data.get("file") or "")
        if f is not None and ev.data.get("file_bytes") is not None:
            await send([layer(f, int(ev.data["file_bytes"]))])


def _job_error(job: Job) -> str:
    if job.state == "failed":
        return job.error or "the download failed; pull again to retry"
    return f"the download was {job.state} (GET /api/downloads/{job.id}); pull again to continue it"


def _land(rt: Runtime, ref: PullRef, job: Job) -> ModelEntry:
    """The pulled model in the catalog, with the pulled name as its alias (so a client can use it)."""
    main = next(f for f in job.files if f.path.lower().endswith(".gguf") and not is_projector(f.path))
    for e in rt.catalog.scan():
        if e.source != "alias" and e.origin is not None and e.origin.repo == job.repo:
            if e.path.as_posix().endswith("/" + main.path):
                if rt.catalog.find(ref.name) is None:
                    rt.library.add_alias(ref.name, target=e.id, by="pull")
                    rt.catalog.scan()
                return e
    raise ModelNotFoundError(
        f"{ref.name} was downloaded but is not in the library; see `switchyard ls` and the server log"
    )


async def _pull(request: web.Request) -> web.StreamResponse:
    """Ollama: pull a GGUF from Hugging Face (`hf.co/ORG/REPO[:QUANT]`), streaming progress NDJSON"""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    ref = parse_pull_name(require_model(body))
    stream = stream_flag(body)
    await asyncio.to_thread(_check_gguf, rt, ref)
    async with rt.bus.subscribe() as q:  # before submit: no event of the new job is missed
        job = await rt.downloads.submit(ref.repo, quant=ref.quant)
        if not stream:
            await rt.downloads.wait(job.id)
            if job.state != "completed":
                raise DownloadError(_job_error(job))
            entry = await asyncio.to_thread(_land, rt, ref, job)
            request[MODEL] = entry.id
            return web.json_response({"status": "success"})
        return await _pull_stream(request, rt, ref, job, q)


async def _pull_stream(
    request: web.Request, rt: Runtime, ref: PullRef, job: Job, q: asyncio.Queue[Event]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)

    async def send(objs: list[dict[str, Any]]) -> None:
        await resp.write(ndjson(objs))

    try:
        await send([{"status": "pulling manifest"}])
        await send([layer(f, job.per_file.get(f.path, 0)) for f in job.files])
        await _follow(q, job, send)
        if job.state != "completed":
            await send([{"error": _job_error(job)}])
        else:
            await send([layer(f, f.size) for f in job.files])
            await send([{"status": "verifying sha256 digest"}])  # done by the transfer, file by file
            await send([{"status": "writing manifest"}])
            entry = await asyncio.to_thread(_land, rt, ref, job)
            request[MODEL] = entry.id
            await send([{"status": "success"}])
        await resp.write_eof()
    except SwitchyardError as exc:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await send([{"error": exc.message}])
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("pull client went away; download %s of %s continues", job.id, job.repo)
    return resp


# ---- delete and copy -----------------------------------------------------------------------------
def _remove(rt: Runtime, model_id: str) -> None:
    remove_model(
        model_id, catalog=rt.catalog, library=rt.library, imported_root=rt.paths.imported, delete_files=False
    )


def _to_delete(rt: Runtime, name: str) -> str:
    """What a delete of `name` removes: a copy's or a create's own name (its model stays), else the model
    (a pulled name is the model the client pulled, as in Ollama), refused while a lane has it loaded."""
    found = _alias(rt, name)
    if found is not None and found[1].get("by") != "pull":
        return found[0]
    if found is None:
        entry = resolve(rt, name)
    else:
        try:
            entry = rt.catalog.get(found[1]["target"], allow_broken=True)
        except ModelNotFoundError:
            rt.library.drop_alias(found[0])  # its model was removed another way: the name goes too
            raise ModelNotFoundError(
                f"model {name!r} not found (its files were removed)", param="model"
            ) from None
    _refuse_loaded(rt, entry, name)  # on the loop: the supervisor's lanes change only there
    return entry.id


async def _delete(request: web.Request) -> web.StreamResponse:
    """Ollama: delete a model, or only the name a copy or create gave it"""
    rt = request.app[RUNTIME]
    name = require_model(parse_body(await request.read()))
    request[MODEL] = name
    target = _to_delete(rt, name)
    await asyncio.to_thread(_remove, rt, target)
    await rt.forget_lane(target)  # a name a copy gave has no lane: nothing to drop
    return web.Response(status=200)


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BadRequestError(f"missing required field {name!r} (a model name)", param=name)
    return value.strip()


def _add_alias(rt: Runtime, source: str, dest: str, *, by: str, param: str) -> ModelEntry:
    entry = resolve(rt, source)
    _refuse_taken(rt, dest, param=param)
    rt.library.add_alias(dest, target=entry.id, by=by)
    rt.catalog.scan()
    return entry


async def _copy(request: web.Request) -> web.StreamResponse:
    """Ollama: make `destination` another name (an alias) of the model `source`"""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    source = _str_field(body, "source")
    dest = alias_name(body.get("destination"), param="destination")
    entry = await asyncio.to_thread(_add_alias, rt, source, dest, by="copy", param="destination")
    request[MODEL] = entry.id
    return web.Response(status=200)


# ---- create --------------------------------------------------------------------------------------
def _create_sync(rt: Runtime, name: str, source: str) -> ModelEntry:
    if not is_local_path(source):
        return _add_alias(rt, source, name, by="create", param="model")
    path = Path(source).expanduser()
    if not path.is_absolute():
        raise BadRequestError(
            f"{source!r} is a relative path; name the GGUF file by its absolute path on this machine",
            param="from",
        )
    if ":" in name:
        raise BadRequestError(
            f"a model created from a file is named without a tag ({name.split(':')[0]!r}); copy it "
            "afterwards (POST /api/copy) for a tagged name",
            param="model",
        )
    _refuse_taken(rt, name, param="model")
    return import_model(
        path, catalog=rt.catalog, library=rt.library, imported_root=rt.paths.imported, name=name
    )


async def _create(request: web.Request) -> web.StreamResponse:
    """Ollama: create a model `from` a model (an alias) or a local GGUF path (an import)"""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    name = alias_name(body.get("model", body.get("name")), param="model")
    stream = stream_flag(body)
    refuse_unsupported(body)
    source = body.get("from")
    if isinstance(body.get("modelfile"), str) and body["modelfile"].strip():
        source = modelfile_source(body["modelfile"])  # older clients
    if not isinstance(source, str) or not source.strip():
        raise BadRequestError(
            "say what to create the model from: 'from' (a model from GET /api/tags, or an absolute path "
            "to a GGUF file on this machine)",
            param="from",
        )
    entry = await asyncio.to_thread(_create_sync, rt, name, source.strip())
    request[MODEL] = entry.id
    if not stream:
        return web.json_response({"status": "success"})
    lines = [{"status": "writing manifest"}, {"status": "success"}]
    return web.Response(body=ndjson(lines), content_type="application/x-ndjson")


routes.post("/api/pull")(_pull)
routes.delete("/api/delete")(_delete)
routes.post("/api/copy")(_copy)
routes.post("/api/create")(_create)
