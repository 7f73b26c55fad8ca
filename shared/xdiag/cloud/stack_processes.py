"""The local stack's services as process groups: each spawned in its own group with its log, waited for until it
answers, signalled as a whole (the emulators' launchers leave their Java child running when only the launcher is
signalled), and never a recycled pid; and the probes that tell a service is up (a port listening, an HTTP answer)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from xdiag.cloud.stack_config import HOST, StackError
from xdiag.text_numbers import whole_number


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        pid = whole_number(entry.name)
        if pid is None:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return members


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class StackProcesses:
    """The services of one state dir: `processes` (name -> {pid, marker, log}) and the `ports` of those that listen.
    A subclass records them where other processes find them (`_save`)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.ports: dict[str, int] = {}
        self.processes: dict[str, dict[str, Any]] = {}  # name -> {pid, marker, log}
        self._popens: dict[str, subprocess.Popen] = {}

    def _save(self) -> None:
        """Records `processes` (after each spawn) where the stack's other processes and commands find them."""
        raise NotImplementedError

    def alive(self) -> bool:
        return any(group_members(p["pid"]) for p in self.processes.values())

    def running(self, name: str) -> bool:
        """Whether the service is up: a live member of its process group, and its port answering where it has one."""
        process = self.processes.get(name)
        if process is None or not any(process["marker"] in _cmdline(pid) for pid in group_members(process["pid"])):
            return False
        return name not in self.ports or listening(self.ports[name])

    def _spawn(self, name: str, argv: list[str], marker: str, extra_env: dict[str, str] | None = None) -> None:
        log_path = self.state_dir / "logs" / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})},
                cwd=self.state_dir,
            )
        self._popens[name] = popen
        self.processes[name] = {"pid": popen.pid, "marker": marker, "log": str(log_path)}
        self._save()

    def _wait(self, ready, what: str, name: str, deadline: float) -> None:
        while True:
            try:
                if ready():
                    return
            except OSError:
                pass
            popen = self._popens.get(name)
            if popen is not None and popen.poll() is not None:
                raise StackError(
                    f"{what} exited with status {popen.returncode} while starting; see {self.processes[name]['log']}:\n"
                    + self.log_tail(name)
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{what} did not start in time; see {self.processes[name]['log']}:\n" + self.log_tail(name)
                )
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(Path(self.processes[name]["log"]).read_text(errors="replace").splitlines()[-lines:])
        except (OSError, KeyError):
            return ""

    def _signal(self, name: str, sig: int) -> bool:
        """Signals the process group of `name` if it is still ours; False when nothing of it is left."""
        process = self.processes.get(name)
        if process is None:
            return False
        members = group_members(process["pid"])
        if not members or not any(process["marker"] in _cmdline(pid) for pid in members):  # never a recycled pid
            return False
        try:
            os.killpg(process["pid"], sig)
        except ProcessLookupError:
            return False
        return True

    def _wait_gone(self, names: list[str], timeout_s: float) -> list[str]:
        """Waits until no member of these process groups is left; returns the names that still have one."""
        until = time.monotonic() + timeout_s
        while True:
            for name in names:
                popen = self._popens.get(name)
                if popen is not None:
                    popen.poll()  # reap our own child
            left = [n for n in names if n in self.processes and group_members(self.processes[n]["pid"])]
            if not left or time.monotonic() > until:
                return left
            time.sleep(0.05)

    def kill(self, names: str | list[str], sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> None:
        """Signals whole process groups (the launchers and their Java children), SIGKILL for what outlives the wait."""
        names = [names] if isinstance(names, str) else names
        signalled = [name for name in names if self._signal(name, sig)]
        left = self._wait_gone(signalled, timeout_s)
        if left and sig != signal.SIGKILL:
            self._wait_gone([name for name in left if self._signal(name, signal.SIGKILL)], timeout_s)
        for name in names:
            popen = self._popens.pop(name, None)
            if popen is not None:
                popen.poll()

    def crash(self, name: str) -> list[int]:
        """SIGKILLs a function's serving processes (not its server's master, which starts new ones): an instance
        dying mid-request, whose deliveries Pub/Sub then retries. Returns the pids killed.

        (Kill the whole function instead and the emulator, finding nothing listening, leaves the messages it
        pushes meanwhile leased until their ack deadline: real Pub/Sub would retry them with backoff.)"""
        leader = self.processes[name]["pid"]
        workers = [
            pid for pid in group_members(leader) if pid != leader and self.processes[name]["marker"] in _cmdline(pid)
        ]
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        return workers

    def freeze(self, name: str) -> None:
        """SIGSTOPs a function's process group: an instance that hangs holding the deliveries pushed to it (the
        emulator then redelivers none of them before their ack deadline, 600 s). `restart` ends it."""
        self._signal(name, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        """SIGCONTs a service `freeze` stopped."""
        self._signal(name, signal.SIGCONT)
