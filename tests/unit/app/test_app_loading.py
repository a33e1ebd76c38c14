"""EVENTFOLD_APP is imported as uvicorn imports an app: from --app-dir, then the working
directory, then the installed packages; Spark's Python workers get the same directories; a
module that is not found names where it was looked for. And `eventfold init` writes a first
app, never over an existing file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eventfold.app import load_app
from eventfold.config import ConfigError, Settings
from eventfold.scaffold import Scaffold
from eventfold.wiring import spark_conf

APP = '''
from eventfold.app import Eventfold
app = Eventfold("{name}")
'''


@pytest.fixture
def clean_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for module in [m for m in sys.modules if m.startswith("loadme")]:
        del sys.modules[module]


def test_the_app_is_found_in_the_working_directory(tmp_path: Path, clean_path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loadme_cwd.py").write_text(APP.format(name="here"))
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [p for p in sys.path if p not in ("", str(tmp_path))]
    assert load_app("loadme_cwd:app").name == "here"


def test_the_app_dir_comes_first(tmp_path: Path, clean_path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cwd" / "loadme_both.py").write_text(APP.format(name="cwd"))
    (tmp_path / "elsewhere" / "loadme_both.py").write_text(APP.format(name="elsewhere"))
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_app("loadme_both", str(tmp_path / "elsewhere")).name == "elsewhere"


def test_a_missing_module_names_the_directories_searched(tmp_path: Path, clean_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_app("loadme_nowhere.sub:app", str(tmp_path / ".."))
    message = str(error.value)
    assert "no module named 'loadme_nowhere'" in message
    assert str(tmp_path) in message and str(tmp_path.parent) in message
    assert "--app-dir" in message


def test_a_missing_dependency_of_the_app_is_not_blamed_on_the_path(
        tmp_path: Path, clean_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loadme_broken.py").write_text("import loadme_not_installed\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="No module named 'loadme_not_installed'") as error:
        load_app("loadme_broken:app")
    assert "searched" not in str(error.value)


def test_spark_workers_import_from_the_same_directories(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(app_dir=str(tmp_path / ".."),
                        spark_conf="spark.executorEnv.PYTHONPATH=/opt/shared")
    path = spark_conf(settings)["spark.executorEnv.PYTHONPATH"].split(":")
    assert path == [str(tmp_path.parent), str(tmp_path), "/opt/shared"]


def test_an_app_dir_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"EVENTFOLD_APP_DIR names .* not a directory"):
        Settings.from_env({"EVENTFOLD_APP_DIR": str(tmp_path / "missing")})


def test_init_writes_a_first_app_and_never_overwrites(tmp_path: Path, clean_path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    written = Scaffold("loadme_first").write(tmp_path)
    assert sorted(p.name for p in written) == ["eventfold.toml", "loadme_first.py",
                                               "test_loadme_first.py"]
    assert 'app = "loadme_first:app"' in (tmp_path / "eventfold.toml").read_text()
    monkeypatch.chdir(tmp_path)
    app = load_app("loadme_first:app")
    assert [p.name for p in app.projections] == ["balances"]
    assert {spec.command.command_name for spec in app.commands} == {"Deposit", "Withdraw"}
    before = (tmp_path / "loadme_first.py").read_text()
    (tmp_path / "loadme_first.py").write_text(before + "# mine\n")
    with pytest.raises(FileExistsError, match="nothing written"):
        Scaffold("loadme_first").write(tmp_path)
    assert (tmp_path / "loadme_first.py").read_text().endswith("# mine\n")
    with pytest.raises(ValueError, match="not a Python module name"):
        Scaffold("my-app")
