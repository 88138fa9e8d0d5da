"""fuse's MCP server: `fuse mcp` (see `fuse.mcp.server`)."""
