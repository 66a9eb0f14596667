"""A stand-in for the real stageml_torch worker, for `pnpm bench host-step`: it speaks the real
framed protocol (the real package's protocol module, loaded from STAGEML_STUB_REAL_PATH) and
answers every request at once, so that what a benchmark times is the host's side of a step."""

PROTOCOL_VERSION = 5
