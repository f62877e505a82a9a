"""Installer inputs that cannot run on this machine, linted: the Inno Setup script (Windows), the
Info.plist and dmg script (macOS), the desktop entry, the icon files and the shell scripts."""

from __future__ import annotations

import configparser
import plistlib
import re
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.package_bundle import REPO

INSTALLERS = REPO / "installers"
ICONS = REPO / "resources" / "icons"
SPEC = (REPO / "build.spec").read_text()


def _iss_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(";") or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = m.group(1)
            sections.setdefault(current, [])
        else:
            sections.setdefault(current, []).append(line)
    return sections


def _iss_params(line: str) -> dict[str, str]:
    """`Name: "x"; Filename: "y"; Flags: a b` -> {"Name": "x", ...}"""
    out = {}
    for part in re.findall(r'(\w+):\s*("[^"]*"|[^;]*)', line):
        out[part[0]] = part[1].strip().strip('"')
    return out


def test_inno_setup_script_references_files_that_exist_and_programs_the_spec_builds() -> None:
    iss = INSTALLERS / "windows" / "switchyard.iss"
    sections = _iss_sections(iss.read_text())
    setup = dict(line.split("=", 1) for line in sections["Setup"])
    here = iss.parent

    def local(win_path: str) -> Path:
        return (here / win_path.replace("\\", "/")).resolve()

    assert local(setup["SetupIconFile"]).is_file()
    assert local(setup["OutputDir"]) == REPO / "dist"
    # the files come from the COLLECT folder build.spec names, and the programs are its EXE names
    sources = [_iss_params(line)["Source"] for line in sections["Files"]]
    assert sources == ["..\\..\\dist\\switchyard\\*"]
    assert 'upx=False, name="switchyard")' in SPEC  # the COLLECT folder: dist/switchyard
    exe_names = set(re.findall(r'name="(switchyardw?)"', SPEC))
    assert {"switchyard", "switchyardw"} <= exe_names
    icons = [_iss_params(line) for line in sections["Icons"]]
    programs = {
        Path(i["Filename"].replace("{app}\\", "")).stem for i in icons if i["Filename"].startswith("{app}")
    }
    assert programs <= exe_names, programs
    names = {i["Name"] for i in icons}
    assert "{group}\\Switchyard" in names  # Start menu
    startup = next(i for i in icons if i["Name"].startswith("{userstartup}"))
    assert startup["Tasks"] == "startup"
    tasks = {_iss_params(line)["Name"] for line in sections["Tasks"]}
    assert "startup" in tasks
    task = next(_iss_params(line) for line in sections["Tasks"] if "startup" in line)
    assert "unchecked" in task["Flags"]  # optional: off unless the user ticks it
    code = "\n".join(sections["Code"])
    assert "function InitializeUninstall(): Boolean;" in code and "StopSwitchyard();" in code
    assert "taskkill.exe" in code and "/T" in code
    assert setup["AppVersion"] == "{#AppVersion}"


def test_macos_info_plist_is_valid_and_makes_a_menu_bar_app() -> None:
    plist = plistlib.loads((INSTALLERS / "macos" / "Info.plist").read_bytes())
    assert plist["LSUIElement"] is True  # no Dock icon: the app lives in the menu bar
    assert plist["CFBundleExecutable"] == "switchyard"
    assert plist["CFBundlePackageType"] == "APPL"
    assert plist["NSHighResolutionCapable"] is True
    assert (ICONS / plist["CFBundleIconFile"]).is_file()
    assert re.fullmatch(r"[a-z]+(\.[a-z]+)+", plist["CFBundleIdentifier"])
    # build.spec merges this plist into its BUNDLE and sets the version from pyproject
    assert 'installers" / "macos" / "Info.plist"' in SPEC and '"CFBundleShortVersionString": VERSION' in SPEC


def test_desktop_entry_has_what_menus_need() -> None:
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    cp.read(INSTALLERS / "linux" / "switchyard.desktop")
    entry = cp["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Name"] == "Switchyard"
    assert entry["Exec"].split()[0] == "switchyard" and entry["Terminal"] == "false"
    assert entry["Icon"] == "switchyard"
    assert entry["Categories"].endswith(";")
    for key in entry:
        assert re.fullmatch(r"[A-Za-z0-9-]+", key), key


def test_icons_are_valid_containers_of_png_images() -> None:
    ET.parse(ICONS / "switchyard.svg")
    for px in (16, 32, 48, 128, 256, 512):
        data = (ICONS / f"switchyard-{px}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == (px, px)
    ico = (ICONS / "switchyard.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    assert (reserved, kind) == (0, 1) and count >= 4
    for i in range(count):
        w, _h, _c, _r, _planes, _bpp, size, offset = struct.unpack("<BBBBHHII", ico[6 + 16 * i : 22 + 16 * i])
        blob = ico[offset : offset + size]
        assert blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) == size
        assert struct.unpack(">I", blob[16:20])[0] == (w or 256)
    icns = (ICONS / "switchyard.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    pos, kinds = 8, []
    while pos < len(icns):
        kind_b, length = icns[pos : pos + 4], struct.unpack(">I", icns[pos + 4 : pos + 8])[0]
        assert icns[pos + 8 : pos + 16] == b"\x89PNG\r\n\x1a\n"
        kinds.append(kind_b)
        pos += length
    assert pos == len(icns) and b"ic08" in kinds  # 256 px, what Finder shows


@pytest.mark.parametrize(
    "script", ["linux/build-deb.sh", "linux/build-tarball.sh", "macos/build-dmg.sh"], ids=lambda s: s
)
def test_installer_scripts_parse_and_are_executable(script: str) -> None:
    path = INSTALLERS / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    r = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
