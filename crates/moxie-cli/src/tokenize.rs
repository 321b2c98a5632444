//! `moxie tokenize`

use std::path::PathBuf;

use std::fmt::Write as _;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Model GGUF (only its metadata is read).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Text to tokenize.
    #[arg(long, conflicts_with = "file")]
    text: Option<String>,
    /// File whose contents to tokenize.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Do not add BOS/EOS even if the model asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Parse special tokens written in the text (e.g. <|im_start|>).
    #[arg(long)]
    parse_special: bool,
    /// Print JSON: ids and pieces.
    #[arg(long)]
    json: bool,
}

pub fn main(a: Args) -> Result<()> {
    let text = match (&a.text, &a.file) {
        (Some(t), None) => t.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
        }
        _ => bail!("give exactly one of --text or --file"),
    };
    let file = moxie_gguf::GgufFile::open_header_only(&a.model)?;
    let tok = crate::run::load_tokenizer(file.metadata())?;
    let ids = tok.encode(&text, !a.no_bos, a.parse_special);
    let mut o = String::new();
    if a.json {
        let pieces: Vec<String> = ids
            .iter()
            .map(|&i| String::from_utf8_lossy(&tok.token_to_piece(i, true)).into_owned())
            .collect();
        let j = serde_json::json!({"ids": ids, "pieces": pieces, "n_tokens": ids.len()});
        writeln!(o, "{j}")?;
    } else {
        for &i in &ids {
            let piece = String::from_utf8_lossy(&tok.token_to_piece(i, true)).into_owned();
            writeln!(o, "{i:>6} -> '{piece}'")?;
        }
        eprintln!("{} tokens", ids.len());
    }
    crate::emit(&o)
}
