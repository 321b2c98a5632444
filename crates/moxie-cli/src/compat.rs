//! Launch lines written for llama-server, llama-bench and their ik_llama.cpp versions.
//!
//! Before clap sees the arguments: flags spelled with one dash and several letters (`-ub`,
//! `-ngl`, ik's `-muge`, which clap would otherwise read as `-m uge`) get their long forms,
//! and the tuning flags of those engines that have no meaning for moxie are taken out, each
//! with one line saying what moxie does instead. Everything else, unknown flags included, is
//! left to clap, which names any flag it does not know.

use std::ffi::OsString;

/// llama.cpp's and ik_llama.cpp's one-dash spellings, and their long forms.
const SPELLINGS: &[(&str, &str)] = &[
    ("-ub", "--ubatch-size"),
    ("-pg", "--n-pg"),
    ("-wb", "--warmup-batch"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ot", "--override-tensor"),
    ("-oe", "--override-experts"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-ngl", "--n-gpu-layers"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-np", "--parallel"),
    ("-to", "--timeout"),
    ("-fa", "--flash-attn"),
    ("-fit", "--fit"),
    ("-tb", "--threads-batch"),
    ("-fmoe", "--fused-moe"),
    ("-mla", "--mla-use"),
    ("-mqkv", "--merge-qkv"),
    ("-muge", "--merge-up-gate-experts"),
    ("-amb", "--attention-max-batch"),
    ("-gr", "--graph-reuse"),
    ("-smgs", "--split-mode-graph-scheduling"),
    ("-rtr", "--run-time-repack"),
    ("-ger", "--grouped-expert-routing"),
];

/// Whether an accepted-and-ignored flag takes a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Value {
    /// Never (`--jinja`).
    No,
    /// Where the next argument is not a flag (llama-bench's `-fmoe 1`, the server's `-fmoe`).
    Optional,
    /// Always (`-mla 3`).
    Required,
}

/// A flag moxie accepts and ignores: its long form, whether it takes a value, and what moxie
/// does instead.
struct Ignored {
    flag: &'static str,
    value: Value,
    instead: &'static str,
}

const IGNORED: &[Ignored] = &[
    Ignored {
        flag: "--jinja",
        value: Value::No,
        instead: "moxie always renders the model's Jinja chat template",
    },
    Ignored {
        flag: "--flash-attn",
        value: Value::Optional,
        instead: "moxie's attention is always computed in tiles (flash-style)",
    },
    Ignored {
        flag: "--fused-moe",
        value: Value::Optional,
        instead: "moxie always evaluates each routed expert's gate, up and down together",
    },
    Ignored {
        flag: "--mla-use",
        value: Value::Required,
        instead: "this command has no MLA setting (run, logits, serve, profile and bench take \
                  --mla-use: 3 expands prompt batches' keys and values as ik_llama.cpp does)",
    },
    Ignored {
        flag: "--merge-qkv",
        value: Value::No,
        instead: "moxie quantizes the attention input once for Q, K and V",
    },
    Ignored {
        flag: "--merge-up-gate-experts",
        value: Value::No,
        instead: "moxie quantizes each expert's input once for its gate and up",
    },
    Ignored {
        flag: "--attention-max-batch",
        value: Value::Required,
        instead: "moxie's prompt attention holds one 512-position tile of the cache per thread \
                  (a few MiB) whatever the context",
    },
    Ignored {
        flag: "--graph-reuse",
        value: Value::Optional,
        instead: "moxie builds no compute graph to reuse",
    },
    Ignored {
        flag: "--split-mode-graph-scheduling",
        value: Value::No,
        instead: "moxie splits the model by layer",
    },
    Ignored {
        flag: "--run-time-repack",
        value: Value::Optional,
        instead: "moxie repacks the CPU's weights at load by default (--no-repack keeps the \
                  file's layout)",
    },
    Ignored {
        flag: "--grouped-expert-routing",
        value: Value::No,
        instead: "moxie routes as the model's metadata says (group-limited where it defines \
                  groups), in full precision",
    },
    Ignored {
        flag: "--warmup-batch",
        value: Value::No,
        instead: "no warm-up batch is run (sweep-bench has its own --warmup-batch)",
    },
];

/// The arguments clap should parse, and the lines to print about flags taken out. `defines`
/// says whether the subcommand being run has a flag of that long name (it then keeps it:
/// `sweep-bench --warmup-batch` is moxie's own).
pub fn rewrite(
    args: impl IntoIterator<Item = OsString>,
    defines: impl Fn(&str) -> bool,
) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        // `--flag=value` keeps its value with it.
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v.to_string())),
            _ => (text, None),
        };
        let long = SPELLINGS
            .iter()
            .find(|(short, _)| *short == name)
            .map_or(name, |(_, long)| *long);
        match long {
            // ik_llama.cpp's graph split falls back to layers for most models, as here.
            "--split-mode" => {
                let value = match inline {
                    Some(v) => Some(v),
                    None => args.next().and_then(|v| v.into_string().ok()),
                };
                let value = match value.as_deref() {
                    Some("graph") => {
                        notes.push(format!("{name} graph: moxie splits the model by layer"));
                        Some("layer".to_string())
                    }
                    _ => value,
                };
                out.push(long.into());
                out.extend(value.map(OsString::from));
                continue;
            }
            // llama.cpp's `-fit on|off`; moxie's `--fit` is a switch.
            "--fit" => {
                let value = inline.or_else(|| switch_value(&mut args));
                match value.as_deref() {
                    None | Some("on") => out.push(long.into()),
                    Some("off") => {}
                    Some(v) => return Err(format!("{name} takes on or off, not '{v}'")),
                }
                continue;
            }
            _ => {}
        }
        if let Some(ig) = IGNORED.iter().find(|i| i.flag == long) {
            if !defines(long) {
                let value = match (ig.value, inline) {
                    (_, Some(v)) => Some(v),
                    (Value::No, None) => None,
                    (Value::Optional, None) => switch_value(&mut args),
                    (Value::Required, None) => match args.next().map(OsString::into_string) {
                        Some(Ok(v)) => Some(v),
                        _ => return Err(format!("{name} needs a value")),
                    },
                };
                let shown = value.map_or(name.to_string(), |v| format!("{name} {v}"));
                notes.push(format!("{shown}: ignored, {}", ig.instead));
                continue;
            }
        }
        out.push(match inline {
            Some(v) if long != name => format!("{long}={v}").into(),
            _ if long != name => long.into(),
            _ => arg,
        });
    }
    Ok((out, notes))
}

/// A switch's optional value (`-fmoe 1`, `-fa on`): the next argument, taken only when it is
/// one of these words, so that nothing else is.
fn switch_value(args: &mut std::iter::Peekable<impl Iterator<Item = OsString>>) -> Option<String> {
    args.next_if(|a| {
        a.to_str()
            .is_some_and(|v| ["0", "1", "on", "off", "auto"].contains(&v))
    })
    .and_then(|a| a.into_string().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str, defines: &[&str]) -> Result<(Vec<String>, Vec<String>), String> {
        let args = line.split_whitespace().map(OsString::from);
        let (out, notes) = rewrite(args, |f| defines.contains(&f))?;
        let out = out.into_iter().map(|a| a.into_string().unwrap()).collect();
        Ok((out, notes))
    }

    #[test]
    fn one_dash_spellings_get_long_forms() {
        let (out, notes) = run("moxie serve -ngl 99 -ub 512 -ctk=q8_0 -np 2 -to 30", &[]).unwrap();
        assert_eq!(
            out,
            "moxie serve --n-gpu-layers 99 --ubatch-size 512 --cache-type-k=q8_0 --parallel 2 --timeout 30"
                .split(' ')
                .collect::<Vec<_>>()
        );
        assert!(notes.is_empty());
    }

    #[test]
    fn ik_tuning_flags_go_with_a_note_and_their_values() {
        let line = "moxie serve -m M --merge-qkv -muge -mla 3 -amb 512 --jinja -fmoe -c 4096 \
                    -rtr 1 -gr -ger --warmup-batch -fa on -tb 24";
        let (out, notes) = run(line, &[]).unwrap();
        let want = [
            "moxie",
            "serve",
            "-m",
            "M",
            "-c",
            "4096",
            "--threads-batch",
            "24",
        ];
        assert_eq!(out, want);
        assert_eq!(notes.len(), 11, "{notes:?}");
        assert!(notes[2].starts_with("-mla 3: ignored, "), "{}", notes[2]);
        assert!(notes[5].starts_with("-fmoe: ignored"), "{}", notes[5]);
        assert!(notes[6].starts_with("-rtr 1: ignored"), "{}", notes[6]);
        // llama-bench gives -fmoe a value.
        let (out, notes) = run("moxie bench -m M -fmoe 1 -p 512", &[]).unwrap();
        assert_eq!(out, ["moxie", "bench", "-m", "M", "-p", "512"]);
        assert_eq!(notes, [format!("-fmoe 1: ignored, {}", IGNORED[2].instead)]);
    }

    #[test]
    fn a_flag_the_subcommand_has_is_kept() {
        let (out, notes) = run("moxie sweep-bench -m M -wb", &["--warmup-batch"]).unwrap();
        assert_eq!(out, ["moxie", "sweep-bench", "-m", "M", "--warmup-batch"]);
        assert!(notes.is_empty());
        // ik's `-mla 3` reaches the commands that take it.
        let (out, notes) = run("moxie serve -m M -mla 3", &["--mla-use"]).unwrap();
        assert_eq!(out, ["moxie", "serve", "-m", "M", "--mla-use", "3"]);
        assert!(notes.is_empty());
    }

    #[test]
    fn graph_split_becomes_layer_and_fit_takes_on_or_off() {
        let (out, notes) = run("moxie serve -sm graph -fit off --fit on", &[]).unwrap();
        assert_eq!(out, ["moxie", "serve", "--split-mode", "layer", "--fit"]);
        assert_eq!(notes.len(), 1);
        let (out, _) = run("moxie plan -sm=row -fit", &[]).unwrap();
        assert_eq!(out, ["moxie", "plan", "--split-mode", "row", "--fit"]);
        assert!(run("moxie serve -fit=maybe", &[])
            .unwrap_err()
            .contains("-fit takes on or off, not 'maybe'"));
        // A word that is no switch value is left for clap to refuse.
        let (out, _) = run("moxie serve -fit maybe", &[]).unwrap();
        assert_eq!(out, ["moxie", "serve", "--fit", "maybe"]);
    }

    #[test]
    fn a_missing_value_and_unknown_flags() {
        assert_eq!(
            run("moxie serve -mla", &[]).unwrap_err(),
            "-mla needs a value"
        );
        // Unknown flags pass through for clap to name.
        let (out, notes) = run("moxie serve --frobnicate 3", &[]).unwrap();
        assert_eq!(out, ["moxie", "serve", "--frobnicate", "3"]);
        assert!(notes.is_empty());
        // A switch takes only a switch's value: a model path after it stays.
        let (out, _) = run("moxie plan --fit M.gguf -fa model.gguf", &[]).unwrap();
        assert_eq!(out, ["moxie", "plan", "--fit", "M.gguf", "model.gguf"]);
    }
}
