"""Every test module runs on every rank under mpirun; gradsync starts once per process."""

import pytest
import torch

import gradsync.torch as hvd


@pytest.fixture(scope="session", autouse=True)
def gradsync_job():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()


def pytest_collection_modifyitems(items):
    # Every rank must run the same collectives in the same order.
    items.sort(key=lambda item: item.nodeid)
    torch.manual_seed(0)
