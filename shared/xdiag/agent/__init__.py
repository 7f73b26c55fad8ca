"""xdiag in the user's own coding agent: the MCP server, the agent skill, and the local result cache they and
`xdiag tool` share. Nothing heavy is imported here: a cached answer is served without loading the tools."""
