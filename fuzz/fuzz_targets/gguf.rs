//! A GGUF image of any bytes: header, metadata, tensor index, tensor bytes, and the tokenizer
//! built from its metadata. Every failure must be an error, never a panic, hang or huge
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moxie_gguf::GgufFile;
use moxie_tokenizer::{Tokenizer, VocabData};

fuzz_target!(|data: &[u8]| {
    for header_only in [false, true] {
        let Ok(f) = GgufFile::from_bytes_with("fuzz.gguf", data.to_vec(), header_only) else {
            continue;
        };
        for (k, v) in f.metadata().iter() {
            std::hint::black_box((k, format!("{v:?}").len()));
        }
        for i in 0..f.tensors().len() {
            let _ = f.tensor_data_at(i);
        }
        std::hint::black_box(f.total_tensor_bytes());
        if let Ok(vocab) = VocabData::from_gguf(f.metadata()) {
            if let Ok(tok) = Tokenizer::new(vocab) {
                let ids = tok.encode("Hello, world! <|im_start|>user\n 123 éà 漢字", true, true);
                std::hint::black_box(tok.detokenize(&ids, false, true));
                std::hint::black_box(tok.decode(&ids, true));
            }
        }
    }
});
