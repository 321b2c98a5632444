//! Tokenizers and chat templates.
