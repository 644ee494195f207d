"""Code generated from ../kv_transfer.proto by `make proto`; do not edit."""
