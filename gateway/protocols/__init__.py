"""Wire formats spoken by built-in processors (eas: TF / Torch / Blade protobuf and JSON)."""
