"""The systemd units: what they must say, and ``systemd-analyze verify`` where it exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobsd.http.settings import HttpSettings
from jobsd.settings import Settings, parse_duration
from jobsd.store.tls import SecuritySettings, check_connection_security

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNITS = ("jobsd.service", "jobsd@.service")
INSTALLED_JOBSD = "/opt/jobsd/.venv/bin/jobsd"


def _settings(unit: str) -> dict[str, list[str]]:
    """Return the unit's KEY=value lines (every value of repeated keys)."""
    found: dict[str, list[str]] = {}
    for line in (SYSTEMD_DIR / unit).read_text().splitlines():
        match = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


@pytest.mark.parametrize("unit", UNITS)
def test_unit_says_what_the_issue_asks(unit: str) -> None:
    s = _settings(unit)
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["Restart"] == ["on-failure"]
    assert s["ExecStart"] == [f"{INSTALLED_JOBSD} run"]
    assert "/etc/jobsd/jobsd.env" in s["EnvironmentFile"]
    assert s["User"] == ["jobsd"] and s["Group"] == ["jobsd"]
    assert s["KillMode"] == ["mixed"]
    assert parse_duration(s["WatchdogSec"][0]) > 0
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"]
    assert s["CapabilityBoundingSet"] == [""]
    # stop: drain, then the outcome writes (as long again), then on_fail hooks (10 s)
    drain_s = Settings.model_fields["drain_timeout"].default
    assert parse_duration(s["TimeoutStopSec"][0]) > 2 * drain_s + 10
    # issue 12: the URL as a credential, bounded resources
    assert s["LoadCredential"] == ["database_url:/etc/jobsd/database_url"]
    assert int(s["LimitNOFILE"][0]) >= 4096 and int(s["TasksMax"][0]) > 0
    assert "JOBSD_WORKER_ID" not in (SYSTEMD_DIR / unit).read_text().replace(
        "Never set JOBSD_WORKER_ID", ""
    )


def test_template_reads_an_instance_file() -> None:
    assert _settings("jobsd@.service")["EnvironmentFile"] == [
        "/etc/jobsd/jobsd.env",
        "-/etc/jobsd/jobsd-%i.env",
    ]


def test_env_example_names_only_real_settings() -> None:
    known = set(Settings.model_fields) | set(HttpSettings.model_fields)
    known |= set(SecuritySettings.model_fields)
    text = (SYSTEMD_DIR / "jobsd.env.example").read_text()
    names = re.findall(r"^#?(JOBSD_[A-Z_]+)=", text, re.MULTILINE)
    assert "JOBSD_DATABASE_URL" in names
    for name in names:
        assert name.removeprefix("JOBSD_").lower() in known, name
    # the production URL of the example (a credential file, or this line) passes
    # jobsd's own check
    (url,) = re.findall(r"^#?JOBSD_DATABASE_URL=(.*sslmode.*)$", text, re.MULTILINE)
    check_connection_security(url, allow_insecure=False)


@pytest.mark.parametrize(("unit", "as_name"), [(u, u.replace("@.", "@mail.")) for u in UNITS])
def test_systemd_analyze_verify(unit: str, as_name: str, tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    # verify checks that ExecStart exists: point it at this checkout's jobsd
    script = Path(sys.executable).parent / "jobsd"
    if not script.exists():
        pytest.skip(f"no installed jobsd script beside {sys.executable}")
    text = (SYSTEMD_DIR / unit).read_text().replace(INSTALLED_JOBSD, str(script))
    (tmp_path / as_name).write_text(text)
    result = subprocess.run(
        [tool, "verify", str(tmp_path / as_name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    # warnings (unknown keys, bad values) go to stderr with exit status 0: none allowed
    ours = [line for line in output.splitlines() if as_name in line or str(tmp_path) in line]
    assert result.returncode == 0 and not ours, output


PRUNE_UNITS = ("jobsd-prune.service", "jobsd-prune.timer")


def test_prune_units_say_what_docs_retention_says() -> None:
    s = _settings("jobsd-prune.service")
    assert s["Type"] == ["oneshot"]
    assert s["ExecStart"] == [f"{INSTALLED_JOBSD} prune $PRUNE_OPTIONS"]
    # the daemons' settings, then the prune's (the owner role's URL) winning
    assert s["EnvironmentFile"] == ["/etc/jobsd/jobsd.env", "/etc/jobsd/jobsd-prune.env"]
    # issue 12: a user of its own, the owner URL as a credential only it can read
    assert s["User"] == ["jobsd-prune"] and s["DynamicUser"] == ["yes"]
    assert s["LoadCredential"] == ["database_url:/etc/jobsd/prune_database_url"]
    assert s["UnsetEnvironment"] == ["JOBSD_DATABASE_URL"]
    assert parse_duration(s["TimeoutStartSec"][0]) >= 3600
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"]
    assert s["CapabilityBoundingSet"] == [""]
    t = _settings("jobsd-prune.timer")
    assert t["OnCalendar"] and t["Persistent"] == ["true"]
    assert "Unit" not in t, "the timer starts the service of its own name"
    assert t["WantedBy"] == ["timers.target"]


def test_systemd_analyze_verify_prune_units(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    script = Path(sys.executable).parent / "jobsd"
    if not script.exists():
        pytest.skip(f"no installed jobsd script beside {sys.executable}")
    # the timer needs its service beside it
    for unit in PRUNE_UNITS:
        text = (SYSTEMD_DIR / unit).read_text().replace(INSTALLED_JOBSD, str(script))
        (tmp_path / unit).write_text(text)
    result = subprocess.run(
        [tool, "verify", *(str(tmp_path / unit) for unit in PRUNE_UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    ours = [line for line in output.splitlines() if str(tmp_path) in line or "jobsd-prune" in line]
    assert result.returncode == 0 and not ours, output
