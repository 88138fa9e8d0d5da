"""The fuse controller: host registry, placement, moves, events, usage and
the elastic pool, over one store."""
