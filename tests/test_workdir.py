"""The work directory's layout, named in one place (dynatune.files.WorkDir): the names on disk stay put."""

import os

from dynatune.files import WorkDir, remove_leftovers

LAYOUT = {  # property -> path below the work dir (these names are on disk in every earlier work dir)
    "config": "config.json",
    "tasks": "tasks.json",
    "run_state": "run.json",
    "rounds": "rounds.jsonl",
    "anchors": "anchors.json",
    "lock": ".lock",
    "warm_start_done": "warm_start.json",
    "library_done": "library.json",
    "cache": "cache",
    "model_dir": "model",
    "model_so": "model.so",
    "session": "session.json",
    "cost_model": "cost_model",
    "db": "db",
    "workloads": "db/workloads.jsonl",
    "records": "db/records.jsonl",
    "measurements": "db/measurements.jsonl",
    "report_dir": "report",
    "summary": "report/summary.json",
    "report_md": "report/report.md",
    "convergence_png": "report/convergence.png",
    "beliefs_png": "report/beliefs.png",
    "profile_json": "report/profile.json",
    "profile_md": "report/profile.md",
    "mlflow_db": "mlflow.db",
    "mlartifacts": "mlartifacts",
    "retune_root": "retune",
}


def test_every_file_and_folder_of_a_work_dir_keeps_its_name(tmp_path):
    wd = WorkDir(tmp_path / "w")
    assert wd.path == str(tmp_path / "w") and os.fspath(wd) == str(wd) == wd.path
    for prop, rel in LAYOUT.items():
        assert getattr(wd, prop) == os.path.join(wd.path, *rel.split("/")), prop
    assert wd.build_dir(123) == os.path.join(wd.path, "tmp-build-123")
    assert wd.retune("20250101T000000Z") == os.path.join(wd.path, "retune", "20250101T000000Z")
    assert WorkDir("runs/x") == WorkDir("runs/x") and WorkDir(wd).path == wd.path
    named = {n for n in dir(WorkDir) if isinstance(getattr(WorkDir, n), property)}
    assert named == set(LAYOUT), "name a new property in LAYOUT"


def test_leftovers_of_a_dead_process_go_those_of_a_live_one_stay(tmp_path):
    wd = WorkDir(tmp_path)
    os.makedirs(wd.report_dir)
    dead = 2**22 + 12345  # above the default pid_max: no such process
    os.makedirs(wd.build_dir(dead))
    os.makedirs(wd.build_dir(os.getpid()))
    open(wd.summary + f".tmp{dead}", "w").close()
    open(wd.summary, "w").close()
    remove_leftovers(wd.path)
    assert sorted(os.listdir(wd.path)) == sorted(["report", f"tmp-build-{os.getpid()}"])
    assert os.listdir(wd.report_dir) == ["summary.json"]
