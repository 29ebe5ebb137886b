"""The results document (``kvattn.benchmarking.records``): the environment, the headline time, the
JSON writer (whole files only)."""

from __future__ import annotations

import json

import pytest
import torch

import kvattn
from kvattn.benchmarking.records import environment, headline_us, write_json


def test_cpu_environment():
    env = environment(torch.device("cpu"))
    assert env["device"] == "cpu" and env["kvattn"] == kvattn.__version__ and env["torch"] == torch.__version__
    assert env["date"].endswith("+00:00") and "sm_count" not in env


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's facts")
def test_gpu_environment():
    env = environment(torch.device("cuda"))
    assert env["device"] == torch.cuda.get_device_name() and env["sm_count"] > 0 and env["memory_bytes"] > 0


@pytest.mark.parametrize("rec,us", [
    ({"graph_us": 5.0, "eager_us": 9.0}, 5.0),
    ({"graph_us": None, "eager_us": 9.0}, 9.0),
    ({"eager_us": None}, None),
])
def test_headline_is_the_graph_time_where_there_is_one(rec, us):
    assert headline_us(rec) == us


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    write_json(str(path), {"records": [{"us": 1.5, "dev": torch.device("cpu")}]})
    text = path.read_text()
    assert text.endswith("}\n") and json.loads(text) == {"records": [{"us": 1.5, "dev": "cpu"}]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
