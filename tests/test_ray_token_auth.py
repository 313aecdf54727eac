"""A Ray cluster with token authentication (RAY_AUTH_MODE=token on its head) and a client without its token: esft's
error says so and what to set, once, before the model loads. Ray 2.60 itself raises a bare "Failed to connect to
Ray cluster at ..." (the refusal is only text in its cause), or, with RAY_AUTH_MODE=token and no token here, its
AuthenticationError, which esft's CLI printed as a traceback (docs/results/bench/ray-token-auth-2026-12-05).

Run: . .venv/bin/activate && pytest -q tests/test_ray_token_auth.py   (~60 s on 2 cores: one `ray start --head`)
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from esft.es.distributed import connection

#: the cause of the ConnectionError that ray.init raised for a client that sent no token, as Ray 2.60 wrote it
#: (the last line of the RuntimeError's text in docs/results/bench/ray-token-auth-2026-12-05/trace.txt, first case;
#: Ray's help text after it shortened)
RAY_CAUSE = ("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
             '  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status\n'
             "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or "
             "incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token'). Ensure that the token for the "
             "cluster is available in a local file (e.g., ~/.ray/auth_token or via RAY_AUTH_TOKEN_PATH) or as the "
             "`RAY_AUTH_TOKEN` environment variable.\n")

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _refused() -> ConnectionError:
    """What ray.init raised: a ConnectionError from the RuntimeError that carries the GCS's refusal."""
    try:
        try:
            raise RuntimeError(RAY_CAUSE)
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:46379") from cause
    except ConnectionError as exc:
        return exc


def test_auth_failure_reads_rays_refusal_and_nothing_else():
    assert connection.auth_failure(_refused()) == "InvalidAuthToken: Authentication token is missing or incorrect"
    for other in (ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:46379"),
                  ConnectionError("ray client connection timeout"), RuntimeError("Failed to connect to GCS.")):
        assert connection.auth_failure(other) is None, other


def test_auth_failure_reads_ray_clients_log():
    """Through Ray Client (`ray://`) the refusal is only in the client's DEBUG log, as Ray 2.60 wrote it
    (docs/results/bench/ray-token-auth-2026-12-05/README.md); the error is a plain timeout."""
    timeout = ConnectionError("ray client connection timeout")
    logged = ["Ray client server unavailable, retrying in 5s...",
              "Received when checking init: Invalid or missing authentication token"]
    assert connection.auth_failure(timeout, logged) == "Invalid or missing authentication token"
    assert connection.auth_failure(timeout, logged[:1]) is None
    assert connection.auth_failure(RuntimeError("unrelated"), logged) is None


def test_auth_failure_knows_rays_authentication_error():
    exceptions = pytest.importorskip("ray.exceptions")
    missing = exceptions.AuthenticationError("Token authentication is enabled but no authentication token was found")
    assert connection.auth_failure(missing) == "Token authentication is enabled but no authentication token was found"
    assert connection.auth_failure(exceptions.RayError("x")) is None


@pytest.mark.parametrize("mode, hint", [(None, "sends no token unless RAY_AUTH_MODE=token"),
                                        ("token", "; give the cluster's token as $RAY_AUTH_TOKEN")])
def test_connect_ray_says_the_cluster_refused_authentication(monkeypatch, mode, hint):
    class RefusingRay:
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            raise _refused()

    monkeypatch.setattr(connection, "import_ray", RefusingRay)
    monkeypatch.setattr(connection, "check_reachable", lambda address: None)
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    with pytest.raises(ConnectionError, match=r"^the Ray cluster at '10.0.0.5:6379' refused authentication") as caught:
        connection.connect_ray("10.0.0.5:6379")
    assert hint in str(caught.value) and "$RAY_AUTH_TOKEN_PATH" in str(caught.value)


def test_connect_ray_reads_ray_clients_log_and_leaves_it_as_it_was(monkeypatch, caplog):
    import logging

    log = logging.getLogger("ray.util.client.worker")

    class ClientRay:  # what Ray Client does with a refused token: log it at DEBUG level, retry, time out
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            log.debug("Received when checking init: Invalid or missing authentication token")
            raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(connection, "import_ray", ClientRay)
    monkeypatch.setattr(connection, "check_reachable", lambda address: None)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    level = log.level
    caplog.set_level(logging.INFO)  # the log shows INFO and above; its handler would take DEBUG too
    caplog.handler.setLevel(logging.DEBUG)
    with pytest.raises(ConnectionError, match=r"^the Ray cluster at 'ray://h:10001' refused authentication \(Ray: "
                                              r"Invalid or missing authentication token\); this client sends no"):
        connection.connect_ray("ray://h:10001")
    assert log.level == level and not log.filters
    assert not [r for r in caplog.records if r.levelno < logging.INFO]  # DEBUG stayed out of the log's handlers


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def token_head():
    """A local Ray head started with RAY_AUTH_MODE=token (its own ports, folder and token; HOME a scratch folder so
    no ~/.ray/auth_token is read); its processes, all in the session `ray start` opened, are ended afterwards."""
    pytest.importorskip("ray")
    root = tempfile.mkdtemp(prefix="esft-rauth-", dir="/tmp")  # short: Ray's socket paths live under it
    home = Path(root) / "home"
    home.mkdir()
    gcs, client, dash, agent, agent_grpc, env_agent, metrics = _free_ports(7)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    ray_cli = str(Path(sys.executable).with_name("ray"))
    cmd = [ray_cli, "start", "--head", f"--port={gcs}", f"--temp-dir={root}/rt", "--disable-usage-stats",
           "--include-dashboard=false", "--num-cpus=1", f"--ray-client-server-port={client}",
           f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
           f"--metrics-export-port={metrics}"]
    start = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        out, _ = start.communicate(timeout=120)
        if start.returncode != 0:
            pytest.skip(f"a token-auth Ray head did not start here: {out[-2000:]}")
        yield {"gcs": f"127.0.0.1:{gcs}", "client": f"ray://127.0.0.1:{client}", "home": home}
    finally:
        _end_session(start.pid)
        shutil.rmtree(root, ignore_errors=True)


def _end_session(sid: int) -> None:
    """End the processes of the process group `sid` (what one `ray start` started): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(sid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(sid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


#: esft's CLI in a fresh process (ray.init's state stays out of the test process), the model's load refused
DRIVER = """
import sys
import esft.models
def load_model(*args, **kwargs):
    raise SystemExit("the model was loaded before the Ray connection failed")
esft.models.load_model = load_model
from esft.cli import main
sys.exit(main(["train", "es", "--model", "smollm2-135m", "--task", "boolq", "--executor", "ray", "--num-workers",
               "1", "--device", "cpu", "--ray-address", sys.argv[1], "--output-dir", sys.argv[2]]))
"""


def _esft_against(address: str, head: dict, tmp_path: Path, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Ray's GCS client tries once a second, 20 times by default: 2 are enough to see the refusal; Ray Client waits
    # 5 s, 10 s, 15 s by default, 1 s, 6 s, 11 s here
    env.update(HOME=str(head["home"]), PYTHONPATH=SRC, HF_HUB_OFFLINE="1", RAY_gcs_server_port_wait_time_s="2",
               RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S="1", **env_vars)
    return subprocess.run([sys.executable, "-c", DRIVER, address, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=180)


def _esft_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("esft")]


@pytest.mark.parametrize("via, refusal", [("gcs", "InvalidAuthToken: Authentication token is missing or incorrect"),
                                          ("client", "Invalid or missing authentication token")])
def test_a_client_without_the_token_is_told_the_cluster_refused_it(token_head, tmp_path, via, refusal):
    address = token_head[via]
    done = _esft_against(address, token_head, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert _esft_lines(done.stderr) == [
        f"esft: connecting to Ray: {address} ...",
        f"esft: error: the Ray cluster at '{address}' refused authentication (Ray: {refusal}); this client sends no "
        "token unless RAY_AUTH_MODE=token: set it and give the cluster's token as $RAY_AUTH_TOKEN, in a file named by "
        "$RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head prints it) "
        "(docs/distributed.md)"], done.stderr[-3000:]
    assert "DEBUG" not in done.stderr, done.stderr[-3000:]  # Ray Client's log, read for the refusal, stays as it was


def test_token_mode_without_a_token_is_one_line_not_a_traceback(token_head, tmp_path):
    done = _esft_against(token_head["gcs"], token_head, tmp_path, RAY_AUTH_MODE="token")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert _esft_lines(done.stderr)[-1] == (
        f"esft: error: cannot authenticate to the Ray cluster at '{token_head['gcs']}' (Ray: Token authentication "
        "is enabled but no authentication token was found); give the cluster's token as $RAY_AUTH_TOKEN, in a file "
        "named by $RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head prints it) "
        "(docs/distributed.md)")
