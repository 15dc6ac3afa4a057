"""Servers for the tests: the zoo's hybrid target (CPU, the demo's model) behind `specpilot serve`'s app, each on a
free loopback port with uvicorn in a background thread. One loaded model serves every app (loaded once); the
apps live for the session and idle between tests."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import uvicorn

from specpilot.cli import _parser, engine_runtime, spec_engine
from specpilot.demo import zoo_dir
from specpilot.engine.scheduler import SchedulerConfig
from specpilot.models.loader import load_model, load_tokenizer
from specpilot.runtime.runner import ModelRunner
from specpilot.server.app import create_app
from specpilot.server.config import ServerConfig
from specpilot.server.uvicorn_server import address, bind

MODEL = "zoo-hybrid"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="session")
def zoo_path() -> str:
    root = zoo_dir()
    if root is None:
        pytest.skip("no trained zoo in this checkout")
    return str(root / "hybrid")


@pytest.fixture(scope="session")
def zoo_tokenizer(zoo_path):
    return load_tokenizer(zoo_path)


@pytest.fixture(scope="session")
def zoo(zoo_path, zoo_tokenizer):
    """(model, tokenizer, target path) of the zoo's hybrid target."""
    return load_model(zoo_path, "cpu", "float32"), zoo_tokenizer, zoo_path


def build_engine(zoo, flags: list[str], max_num_seqs: int, max_model_len: int = 256):
    """The engine `specpilot serve --target <zoo hybrid> FLAGS` builds, on the already loaded model."""
    model, tokenizer, path = zoo
    args = _parser().parse_args(["serve", "--target", path, *flags])
    runner = ModelRunner(model, engine_runtime(args, model))
    return spec_engine(args, runner, tokenizer, SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len))


@contextmanager
def running(app):
    """Serves the app on a free loopback port in a thread; yields its base URL; shuts it down gracefully."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the test server did not start")
            thread.join(0.02)
        yield address(sock)
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


class Served:
    def __init__(self, app, url: str):
        self.app, self.url = app, url
        self.loop = app.state.engine_loop
        self.engine = self.loop.engine

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, **kwargs)

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, **kwargs)




@pytest.fixture(scope="session")
def served(zoo):
    """The main server: the zoo's DFlash drafter, chain:7, 16 slots of 256 tokens, a chat template."""
    flags = ["--drafter", str(zoo_dir() / "hybrid-dflash"), "--tree", "chain:7"]
    app = create_app(build_engine(zoo, flags, 16), zoo[1], ServerConfig(MODEL, chat_template=CHAT_TEMPLATE))
    with running(app) as url:
        yield Served(app, url)


@pytest.fixture(scope="session")
def small(zoo):
    """A small server: n-gram drafter, 2 slots, 2 more requests queued (429 past 4 held), no chat template."""
    app = create_app(build_engine(zoo, ["--drafter", "ngram"], 2), zoo[1], ServerConfig(MODEL, max_waiting=2))
    with running(app) as url:
        yield Served(app, url)
