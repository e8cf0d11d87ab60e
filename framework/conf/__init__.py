"""The shipped config groups; a package so Hydra can find them as pkg://framework.conf when installed."""
