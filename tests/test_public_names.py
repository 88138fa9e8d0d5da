"""The SDK's public names are a contract: this test locks them."""

import fuse

SEED_000 = {"Client", "AsyncClient", "RegisterHostRequest", "HostCapacity", "Host", "ApiError", "is_conflict",
            "is_not_found", "is_invalid_argument"}


def test_seed_names_are_exported():
    assert SEED_000 <= set(fuse.__all__)
    for name in fuse.__all__:
        assert hasattr(fuse, name), name


def test_api_error_carries_status_code_and_message():
    err = fuse.ApiError(409, "conflict", "host h still has vm v assigned")
    assert (err.status, err.code, err.message) == (409, "conflict", "host h still has vm v assigned")
    assert fuse.is_conflict(err) and not fuse.is_not_found(err)
