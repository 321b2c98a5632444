//! `moxie bench --ab 'FLAGS_A' --ab 'FLAGS_B' [...]` (issue 19): configurations compared on
//! wall-clock time. Each arm is the bench command line with its flags added (any `bench` flag:
//! `-t 8`, `--no-repack`, `-ot ...`, `-ub 256`, `--exact`); every arm is loaded, then the
//! repetitions alternate A B A B ... on the same tests, so drifts of a shared machine fall on
//! every arm alike. Each arm's t/s is reported with its spread, and each arm's ratio to the
//! first with a 95% confidence interval from the per-round ratios (one-shot comparisons lie by
//! ±20% on a shared machine).

use std::ffi::OsString;

use anyhow::{bail, Context, Result};
use moxie_core::bench::{mean_std, run_once, BenchTest};
use moxie_core::{KvTypes, Model, Parallel};

use crate::bench::{load, Args, LoadSizes};

/// One configuration: its flags, loaded model and settings.
struct Arm {
    flags: String,
    model: Model,
    par: Parallel,
    ubatch: usize,
    kv: KvTypes,
}

/// Split `flags` like a shell does for plain words and quoted strings (`-ot "a b=CPU"`).
pub fn split_flags(flags: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in flags.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        bail!("--ab '{flags}': unclosed quote");
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// The command line without its `--ab` flags and their values.
fn without_ab(argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in argv {
        if skip {
            skip = false;
            continue;
        }
        match a.to_str() {
            Some("--ab") => skip = true,
            Some(s) if s.starts_with("--ab=") => {}
            _ => out.push(a.clone()),
        }
    }
    out
}

/// The first value of a list flag, refusing several (an arm is one configuration).
fn one<T: Copy>(values: &[T], flag: &str, arm: &str) -> Result<Option<T>> {
    match values {
        [] => Ok(None),
        [v] => Ok(Some(*v)),
        _ => bail!("--ab '{arm}': {flag} takes one value per arm (given on the common line and in the arm?)"),
    }
}

pub fn main(base: &Args, arms: &[String]) -> Result<()> {
    if arms.len() < 2 {
        bail!("--ab needs at least two arms (--ab 'FLAGS_A' --ab 'FLAGS_B')");
    }
    let argv = without_ab(&std::env::args_os().collect::<Vec<_>>());
    let tests = crate::bench::tests(base)?;
    let mut loaded = Vec::new();
    for flags in arms {
        let mut line = argv.clone();
        line.extend(split_flags(flags)?.into_iter().map(OsString::from));
        let (matches, notes) =
            crate::parse_launch_line(line).map_err(|e| anyhow::anyhow!("--ab '{flags}': {e}"))?;
        for n in notes {
            eprintln!("moxie: {n}");
        }
        let bench = matches
            .subcommand_matches("bench")
            .context("--ab: not a bench command line")?;
        let a = <Args as clap::FromArgMatches>::from_arg_matches(bench)?;
        if a.model.len() != 1 {
            bail!("--ab '{flags}': one model per arm (-m)");
        }
        if crate::bench::tests(&a)? != tests {
            bail!("--ab '{flags}': the arms must run the same tests (-p, -n, -pg, -d)");
        }
        let threads = one(&a.threads, "-t", flags)?.unwrap_or(Parallel::available().n_threads());
        let batch = one(&a.batch, "-b", flags)?.unwrap_or(2048);
        let ubatch = one(&a.ubatch, "-ub", flags)?.unwrap_or(512).min(batch);
        let kv = KvTypes {
            k: one(&a.cache_type_k, "-ctk", flags)?.unwrap_or(KvTypes::default().k),
            v: one(&a.cache_type_v, "-ctv", flags)?.unwrap_or(KvTypes::default().v),
        };
        let path = &a.model[0];
        eprintln!("--ab arm {}: {flags}", loaded.len() + 1);
        let sizes = LoadSizes {
            n_batch: batch,
            n_ubatch: ubatch,
            kv_types: kv,
            n_threads: threads,
        };
        let model = load(crate::open_gguf(path)?, path, &a, bench, &tests, sizes)?;
        loaded.push(Arm {
            flags: flags.clone(),
            model,
            par: Parallel::new(threads).with_numerics(crate::run::numerics(a.exact)),
            ubatch,
            kv,
        });
    }
    let mut out = String::from(
        "| test | arm | flags | t/s | ratio to arm 1 (95% CI) |\n| --- | ---: | --- | ---: | --- |\n",
    );
    for &test in &tests {
        let samples = alternate(&loaded, test, base.reps, base.warms_up())?;
        for (i, (arm, s)) in loaded.iter().zip(&samples).enumerate() {
            let (m, sd) = mean_std(s);
            let ratio = if i == 0 {
                "1".to_owned()
            } else {
                let (r, lo, hi) = ratio_ci(&samples[0], s);
                format!("{r:.3} ({lo:.3}-{hi:.3})")
            };
            out.push_str(&format!(
                "| {} | {} | `{}` | {m:.2} ± {sd:.2} | {ratio} |\n",
                test.name(),
                i + 1,
                arm.flags
            ));
        }
    }
    crate::emit(&out)
}

/// `reps` rounds of every arm in turn (after one warm-up run each): per arm, its t/s per round.
fn alternate(arms: &[Arm], test: BenchTest, reps: usize, warmup: bool) -> Result<Vec<Vec<f64>>> {
    if warmup {
        for a in arms {
            run_once(&a.model, &a.par, test.warm_up(), a.ubatch, a.kv)?;
        }
    }
    let mut samples = vec![Vec::with_capacity(reps); arms.len()];
    for _ in 0..reps {
        for (a, s) in arms.iter().zip(samples.iter_mut()) {
            s.push(run_once(&a.model, &a.par, test, a.ubatch, a.kv)?);
        }
    }
    Ok(samples)
}

/// The geometric mean of the per-round ratios `b[i] / a[i]` and its 95% confidence interval
/// (Student's t on the log ratios; one round: no interval, the ratio itself twice).
pub fn ratio_ci(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let logs: Vec<f64> = a.iter().zip(b).map(|(x, y)| (y / x).ln()).collect();
    let n = logs.len();
    let mean = logs.iter().sum::<f64>() / n.max(1) as f64;
    if n < 2 {
        return (mean.exp(), mean.exp(), mean.exp());
    }
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t_975(n - 1) * (var / n as f64).sqrt();
    (mean.exp(), (mean - half).exp(), (mean + half).exp())
}

/// Student's t quantile 0.975 for `df` degrees of freedom.
fn t_975(df: usize) -> f64 {
    const T: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    match df {
        0 => f64::INFINITY,
        1..=10 => T[df - 1],
        11..=20 => 2.228 - (df - 10) as f64 * (2.228 - 2.086) / 10.0,
        21..=30 => 2.086 - (df - 20) as f64 * (2.086 - 2.042) / 10.0,
        _ => 1.96,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_split_like_a_shell() {
        assert_eq!(
            split_flags(r#"-t 2  -ot "blk\.3\.=CPU" --no-repack '-x y'"#).unwrap(),
            ["-t", "2", "-ot", r"blk\.3\.=CPU", "--no-repack", "-x y"]
        );
        assert_eq!(split_flags("").unwrap(), Vec::<String>::new());
        assert_eq!(split_flags("''").unwrap(), [""]);
        assert!(split_flags("-ot \"a").is_err());
        let argv: Vec<OsString> = [
            "moxie",
            "bench",
            "--ab",
            "-t 1",
            "-m",
            "M",
            "--ab=-t 2",
            "-r",
            "3",
        ]
        .map(OsString::from)
        .to_vec();
        assert_eq!(
            without_ab(&argv),
            ["moxie", "bench", "-m", "M", "-r", "3"].map(OsString::from)
        );
    }

    #[test]
    fn ratio_interval_brackets_the_paired_ratios() {
        let a = [100.0, 110.0, 90.0, 105.0];
        let b = [120.0, 130.0, 110.0, 126.0];
        let (r, lo, hi) = ratio_ci(&a, &b);
        assert!(lo < r && r < hi && lo > 1.1 && hi < 1.3, "{r} {lo} {hi}");
        let (r, lo, hi) = ratio_ci(&[100.0], &[50.0]);
        assert_eq!((r, lo, hi), (0.5, 0.5, 0.5));
        assert!((t_975(4) - 2.776).abs() < 1e-9 && t_975(100) == 1.96);
    }
}
