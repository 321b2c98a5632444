//! GGUF reading and writing.
