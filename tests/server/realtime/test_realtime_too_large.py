"""An event over the Realtime bound (issue 33): the client hears the Realtime API's `error` event, saying
what the bound is, before the socket closes with 1009. A real app and an independent WebSocket client
(the `websockets` package), which sends the event whole while it reads what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app
from app.server.realtime.routes import MAX_EVENT

pytest.importorskip("onnxruntime")
pytest.importorskip("websockets")
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


@pytest.mark.parametrize("size", [MAX_EVENT + 1, 3 * MAX_EVENT // 2])
async def test_an_oversized_event_is_answered_with_an_error_event_then_1009(
    tmp_path: Path, size: int
) -> None:
    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "h")
    )
    async with TestServer(make_app(rt)) as server:
        url = f"ws://{server.host}:{server.port}/v1/realtime?intent=transcription"
        async with connect(url, max_size=1 << 20, open_timeout=30) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            audio = "A" * (size - 40)
            event = json.dumps({"type": "input_audio_buffer.append", "audio": audio})
            assert len(event) > MAX_EVENT
            # sent beside the reading: the server answers as soon as the frame's length says too much
            sending = asyncio.ensure_future(ws.send(event))
            got = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert got["type"] == "error", got
            err = got["error"]
            assert err["code"] == "event_too_large" and err["type"] == "invalid_request_error"
            assert f"at most {MAX_EVENT >> 20} MiB" in err["message"], err["message"]
            assert audio[:20] not in json.dumps(got)  # nothing of the event is quoted
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(sending, 30)
        assert ws.close_code == 1009, ws.close_code
        assert ws.close_reason == f"event over {MAX_EVENT >> 20} MiB"
