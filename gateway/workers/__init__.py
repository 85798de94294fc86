"""Worker processes, their processors, the framed RPC to them and their supervisor (pool)."""
