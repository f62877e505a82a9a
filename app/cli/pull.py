"""`switchyard pull REPO[:QUANT|:FILE]` and `switchyard update [REPO] [--rollback]`.

With a server running (app/cli/client.py finds one that answers), the job is queued there
through the admin API and its progress followed as server-sent events, so the server and the CLI never
fetch the same file twice; otherwise the download manager runs in this process. Either way Ctrl-C pauses:
the partial bytes stay and the next `pull` continues from them.

Exit codes: 0 done (or already up to date), 1 the download failed or was cancelled, 2 bad input or an
error before the download started (unknown repository, no such quantization, no space), 130 interrupted
(paused; run the same command again to continue).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import IO, Any

from app.cli.client import ServerClient
from app.cli.context import CliContext
from app.cli.options import Subparsers, api_key_arg
from app.core.errors import BadRequestError, SwitchyardError
from app.core.paths import Paths
from app.core.settings import Settings
from app.hub.refs import split_ref

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "pull", help="download a model from Hugging Face (resumable, verified, into the HF cache)"
    )
    p.add_argument(
        "ref", metavar="REPO[:QUANT|:FILE]", help="e.g. org/Model-GGUF:Q4_K_M or org/Model-GGUF:a.gguf"
    )
    p.add_argument("--revision", help="branch, tag or commit (default main)")
    p.add_argument(
        "--mmproj",
        metavar="FILE",
        help="the vision projector to pull with the quantization (default: the f16 one; 'none': none)",
    )
    _server_args(p)
    u = sub.add_parser(
        "update", help="fetch a pulled repository's new commit beside the old; --rollback undoes"
    )
    u.add_argument(
        "repo", nargs="?", help="owner/name, or a model id from `switchyard ls` (default: every one)"
    )
    u.add_argument(
        "--rollback", action="store_true", help="point refs/main back at the commit before the update"
    )
    u.add_argument("--revision", default="main", help="the ref to follow (default main)")
    u.add_argument(
        "--eval",
        metavar="SUITE",
        help="score the new revision with this suite first; it becomes current only if it passes",
    )
    u.add_argument("--min-score", type=float, help="the pass mark for --eval, from 0 to 1")
    _server_args(u)


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="use the server at this address (default: the running one, if any)")
    p.add_argument("--local", action="store_true", help="download in this process even if a server runs")
    p.add_argument(
        "--detach", action="store_true", help="start it as a job of the running server, print its id, return"
    )
    api_key_arg(p)


# --- progress ---------------------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f}"


class Bars:
    """One line per file: bytes, percent, and the job's rate and ETA on the active file's line. Redrawn in
    place on a terminal; elsewhere (a log, a pipe) a plain line per file at most every few seconds."""

    def __init__(self, files: list[dict[str, Any]], *, out: IO[str] = sys.stdout) -> None:
        self.out = out
        self.tty = out.isatty()
        self.files: dict[str, list[int]] = {f["path"]: [0, int(f["size"])] for f in files}
        self.active: str | None = None
        self.rate = 0
        self.eta: float | None = None
        self._drawn = 0
        self._plain: dict[str, float] = {}

    def seed(self, per_file: dict[str, int]) -> None:
        for path, done in per_file.items():
            if path in self.files:
                self.files[path][0] = done

    def update(self, data: dict[str, Any]) -> None:
        path = data.get("file")
        if path in self.files and data.get("file_bytes") is not None:
            self.files[path][0] = int(data["file_bytes"])
            self.active = path
        self.rate, self.eta = int(data.get("rate_bps") or 0), data.get("eta_s")
        self.draw()

    def _line(self, path: str) -> str:
        done, total = self.files[path]
        pct = 100.0 if total == 0 else 100 * done / total
        line = f"{path}  {_mib(done)}/{_mib(total)} MiB  {pct:5.1f}%"
        if path == self.active and done < total and self.rate:
            eta = f"  ETA {self.eta:.0f}s" if self.eta is not None else ""
            line += f"  {self.rate / 2**20:.1f} MiB/s{eta}"
        return line

    def draw(self, *, final: bool = False) -> None:
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F")
            for path in self.files:
                self.out.write("\x1b[2K" + self._line(path) + "\n")
            self._drawn = len(self.files)
        else:
            now = time.monotonic()
            for path in self.files if final else [self.active] if self.active else []:
                if final or now - self._plain.get(path, 0) >= 2:
                    self._plain[path] = now
                    self.out.write(self._line(path) + "\n")
        self.out.flush()


# --- local ------------------------------------------------------------------------------------------


def _manager(settings: Settings, paths: Paths) -> Any:
    from app.core.events import EventBus
    from app.hub.download import DownloadManager
    from app.hub.token import TokenStore

    return DownloadManager(
        settings=settings,
        bus=EventBus(),
        state_dir=paths.home / "downloads",
        token=TokenStore(paths, settings).get,
        resume_on_start=False,  # a CLI pull fetches what it is asked for; the server resumes the rest
        on_complete=lambda repo: _mark_download(paths, repo),
    )


def _mark_download(paths: Paths, repo: str) -> None:
    """The library lists the repository's models as downloaded (not merely found in the HF cache)."""
    from app.library.store import Library

    library = Library.open(paths)
    try:
        library.mark_download(repo)
    finally:
        library.close()


async def _follow_local(mgr: Any, job: Any) -> int:
    bars = Bars([f.public() for f in job.files])
    bars.seed(job.per_file)
    bars.draw()
    async with mgr.bus.subscribe() as q:
        waiter = asyncio.create_task(mgr.wait(job.id))
        try:
            while not waiter.done() or not q.empty():
                try:
                    ev = await asyncio.wait_for(q.get(), 0.5)
                except TimeoutError:
                    continue
                if ev.data.get("id") == job.id and ev.kind == "download.progress":
                    bars.update(ev.data)
        except asyncio.CancelledError:
            mgr.pause(job.id)  # Ctrl-C: keep the partials, mark the job paused
            raise
    bars.draw(final=True)
    return _outcome(job.public())


def _outcome(job: dict[str, Any]) -> int:
    state = job["state"]
    if state == "completed":
        print(f"{job['repo']}@{job['commit'][:12]}: {len(job['files'])} file(s) verified and in the cache")
        return EXIT_OK
    if state == "paused":
        print(f"{job['repo']}: paused; run the same command again to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"switchyard: {job['repo']}: {state}: {job.get('error') or ''}".rstrip(": "), file=sys.stderr)
    return EXIT_FAILED


async def _pull_local(
    args: argparse.Namespace, paths: Paths, settings: Settings, repo: str, sel: str | None
) -> int:
    async with _manager(settings, paths) as mgr:
        job = await mgr.submit(repo, revision=args.revision, quant=sel, mmproj=args.mmproj)
        return await _follow_local(mgr, job)


# --- through a running server -----------------------------------------------------------------------


def _running_server(args: argparse.Namespace, ctx: CliContext) -> ServerClient | None:
    return None if args.local else ctx.running(args.url, api_key=args.api_key)


def _follow_remote(server: ServerClient, job: dict[str, Any]) -> int:
    bars = Bars(job["files"])
    try:
        for kind, data in server.events(f"/api/downloads/events?id={job['id']}"):
            if kind == "snapshot":
                current = data["downloads"][0] if data["downloads"] else job
                job = current
                if current["state"] not in ("queued", "running"):
                    break
            elif kind == "download.progress":
                bars.update(data)
            elif kind in ("download.completed", "download.failed", "download.cancelled", "download.paused"):
                break
        job = server.get(f"/api/downloads/{job['id']}", timeout=120)
    except KeyboardInterrupt:
        server.call("POST", f"/api/downloads/{job['id']}/pause", timeout=120)
        print(
            f"{job['repo']}: paused on the server at {server.url}; run the same pull again to continue",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    bars.draw(final=True)
    return _outcome(job)


# --- commands ---------------------------------------------------------------------------------------


def _detached_update(args: argparse.Namespace, ctx: CliContext) -> int:
    """`update --detach`: each update (gated where the model has a gate) becomes a job of the server."""
    from app.cli.jobs import start_detached

    if args.rollback:
        raise BadRequestError("--rollback is immediate: run it without --detach")
    if args.eval or args.min_score is not None or (args.repo and args.repo in ctx.base_settings().jobs.gates):
        body: dict[str, Any] = {"kind": "update", "model": args.repo}
        if args.eval:
            body.update(_suite(args.eval), min_score=args.min_score)
        return start_detached(args, ctx, body, what="update --detach")
    settings = ctx.settings(args)
    repos = [_repo_of(args.repo, ctx.paths, settings)] if args.repo else _cached_repos(settings)
    for repo in repos:
        body = {"kind": "update", "repo": repo, "revision": args.revision}
        start_detached(args, ctx, body, what="update --detach")
    return EXIT_OK


def cmd_pull(args: argparse.Namespace, ctx: CliContext) -> int:
    repo, sel = split_ref(args.ref)
    if args.detach:
        from app.cli.jobs import start_detached

        body = {
            "kind": "download",
            "repo": repo,
            "revision": args.revision,
            "quant": sel,
            "mmproj": args.mmproj,
        }
        return start_detached(args, ctx, body, what="pull --detach")
    server = _running_server(args, ctx)
    if server is not None:
        body = {"repo": repo, "revision": args.revision, "quant": sel, "mmproj": args.mmproj}
        job = server.call("POST", "/api/downloads", body=body, timeout=120)
        print(f"queued on the server at {server.url} as download {job['id']}", file=sys.stderr)
        return _follow_remote(server, job)
    try:
        return asyncio.run(_pull_local(args, ctx.paths, ctx.settings(args), repo, sel))
    except KeyboardInterrupt:
        print(f"{repo}: paused; run the same pull again to continue", file=sys.stderr)
        return EXIT_INTERRUPTED


def _repo_of(target: str, paths: Paths, settings: Settings) -> str:
    """The repository to update: the one a library model (`org/repo/file`, `org/repo:Q4_K_M`) was pulled
    from, or `owner/name` as given."""
    from app.core.errors import ModelNotFoundError
    from app.library.opening import open_catalog

    library, catalog = open_catalog(settings, paths)
    try:
        path = catalog.get(target, allow_broken=True).path
    except ModelNotFoundError:
        if target.count("/") == 1 and ":" not in target:
            return target
        raise
    finally:
        library.close()
    for part in Path(path).parts:
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/", 1)
    raise SwitchyardError(f"{target} did not come from Hugging Face ({path}); there is nothing to update")


def _cached_repos(settings: Settings) -> list[str]:
    from app.hub.config import hub_config

    cache = hub_config(settings).cache_dir
    return sorted(
        d.name[len("models--") :].replace("--", "/", 1)
        for d in (cache.iterdir() if cache.is_dir() else [])
        if d.name.startswith("models--") and (d / "refs" / "main").exists()
    )


async def _update_local(args: argparse.Namespace, paths: Paths, settings: Settings, repos: list[str]) -> int:
    code = EXIT_OK
    async with _manager(settings, paths) as mgr:
        for repo in repos:
            if args.rollback:
                r = mgr.rollback(repo, revision=args.revision)
                print(f"{repo}: refs/{args.revision} back at {r['commit'][:12]} (was {r['previous'][:12]})")
                continue
            job = await mgr.update(repo, revision=args.revision)
            if job is None:
                print(f"{repo}: up to date")
                continue
            print(f"{repo}: {job.previous[:12]} -> {job.commit[:12]}, fetching {len(job.files)} file(s)")
            code = max(code, await _follow_local(mgr, job))
    return code


def _gated(args: argparse.Namespace, ctx: CliContext) -> int:
    """`update MODEL --eval SUITE --min-score N`, or a model with a standing gate: the server (the
    running one, else one in this process) fetches, scores and switches or keeps (docs/evals.md)."""
    from app.cli.run import server_for

    if args.rollback or not args.repo:
        raise BadRequestError(
            "a gated update names one model: `switchyard update MODEL --eval SUITE --min-score N`"
        )
    body: dict[str, Any] = {"model": args.repo}
    if args.eval:
        if args.min_score is None or not 0 <= args.min_score <= 1:
            raise BadRequestError("--eval needs --min-score, a pass mark from 0 to 1")
        body.update(_suite(args.eval), min_score=args.min_score)

    def show(kind: str, data: Any) -> None:
        if kind == "job":
            print(f"{args.repo}: fetching {data['commit'][:12]} beside {str(data['previous'])[:12]}")
        elif kind == "case":
            print(f"  [{data['index']}/{data['total']}] {data['id']}: {data['score']:.2f} ({data['reason']})")

    with server_for(args, ctx) as server:
        decision = server.outcome(
            "/api/hub/gated-update",
            body=body,
            timeout=3600,
            show=show,
            stopped="the gated update stopped, nothing changed",
            unfinished="the server ended the gated update without a decision; nothing was changed",
        )
    if decision["status"] == "up_to_date":
        print(f"{args.repo}: up to date")
        return EXIT_OK
    score = f"{decision['score']:.3f} against {decision['min_score']:g} on {decision['suite']}"
    if decision["status"] == "switched":
        print(f"{args.repo}: switched to {decision['commit'][:12]} ({score}; eval run {decision['run']})")
        return EXIT_OK
    print(
        f"{args.repo}: kept {str(decision['previous'])[:12]}; the new revision scored {score} and was removed"
        f" (eval run {decision['run']})"
    )
    return EXIT_FAILED


def cmd_update(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.detach:
        return _detached_update(args, ctx)
    if args.rollback and (args.eval or args.min_score is not None):
        raise BadRequestError("--rollback goes back to the commit before the last update: it takes no --eval")
    # a standing gate scores updates; a rollback goes back to a commit that was current before, unscored
    gated = args.repo and args.repo in ctx.base_settings().jobs.gates and not args.rollback
    if args.eval or args.min_score is not None or gated:
        return _gated(args, ctx)
    paths, settings = ctx.paths, ctx.settings(args)
    repos = [_repo_of(args.repo, paths, settings)] if args.repo else _cached_repos(settings)
    if not repos:
        print("nothing to update: no pulled repositories in the Hugging Face cache")
        return EXIT_OK
    server = _running_server(args, ctx)
    if server is None:
        try:
            return asyncio.run(_update_local(args, paths, settings, repos))
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    code = EXIT_OK
    for repo in repos:
        body = {"repo": repo, "revision": args.revision, "rollback": args.rollback}
        r = server.call("POST", "/api/hub/update", body=body, timeout=120)
        if r["status"] == "queued":
            print(f"{repo}: {r['job']['previous'][:12]} -> {r['job']['commit'][:12]}")
            code = max(code, _follow_remote(server, r["job"]))
        elif r["status"] == "rolled_back":
            print(f"{repo}: refs/{args.revision} back at {r['commit'][:12]} (was {r['previous'][:12]})")
        else:
            print(f"{repo}: up to date")
    return code


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    return cmd_pull(args, ctx) if args.command == "pull" else cmd_update(args, ctx)


def _suite(suite: str) -> dict[str, str]:
    """A gated update's suite fields: a file is read here and sent as text (the server reads files only
    from its suites folder, and may have another data folder than this command)."""
    from app.quality.suite import read_suite_file

    path = Path(suite).expanduser()
    return {"suite": path.name, "suite_text": read_suite_file(path)} if path.is_file() else {"suite": suite}
