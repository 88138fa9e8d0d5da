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


def test_is_conflict_is_the_conflict_code_only_not_every_409():
    for code in ("host_full", "vm_exists", "move_in_progress", "fleet_full", "not_movable"):
        assert not fuse.is_conflict(fuse.ApiError(409, code, "")), code
    assert not fuse.is_conflict(fuse.ApiError(409, "", "a 409 without an error envelope"))
    assert not fuse.is_conflict(RuntimeError("conflict"))


def test_is_helpers_walk_the_exception_chain():
    def raised(outer_from: bool):
        try:
            try:
                raise fuse.ApiError(409, "conflict", "host h still has vm v assigned")
            except fuse.ApiError as inner:
                if outer_from:
                    raise RuntimeError("deregister failed") from inner
                raise RuntimeError("deregister failed")
        except RuntimeError as outer:
            return outer

    assert fuse.is_conflict(raised(True)) and fuse.is_conflict(raised(False))
    try:
        try:
            raise fuse.ApiError(404, "not_found", "host h not found")
        except fuse.ApiError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert fuse.is_not_found(outer) and not fuse.is_conflict(outer) and not fuse.is_invalid_argument(outer)
