//! The output head: the final RMS norm and the projection to vocabulary logits, for the rows
//! the caller asks for; the logits (and, when asked, the normed hidden rows an MTP head drafts
//! from) come back to the host.

use crate::device::{DeviceId, Resident, CPU};
use crate::forward::Pass;
use crate::gpu_pass::{weight, F32};
use crate::loader::Vector;
use crate::model::Logits;
use crate::ops;
use crate::tensor::Tensor;
use crate::{Error, Result};

pub struct OutputHead {
    pub norm: Vector,
    /// `output` (or the token embeddings, when the model ties them).
    pub output: Tensor,
}

/// What a head run gives back: logits, and the normed hidden rows when asked for.
pub(crate) struct HeadOut {
    pub logits: Vec<f32>,
    pub hidden: Option<Vec<f32>>,
}

impl OutputHead {
    pub fn device(&self) -> DeviceId {
        self.output.device
    }

    /// The logits of the rows `which` asks for (`n_vocab` each), on the host; with
    /// `want_hidden`, also those rows after the norm (`n_embd` each).
    pub(crate) fn run(
        &self,
        p: &mut Pass,
        x: &mut Resident,
        which: Logits,
        want_hidden: bool,
    ) -> Result<HeadOut> {
        head(p, x, which, want_hidden, &self.norm, &self.output)
    }
}

/// RMS norm with `norm`, then the projection `output`, of the rows `which` asks for.
pub(crate) fn head(
    p: &mut Pass,
    x: &mut Resident,
    which: Logits,
    want_hidden: bool,
    norm: &Vector,
    output: &Tensor,
) -> Result<HeadOut> {
    let (n, e, eps) = (p.n, p.c.n_embd, p.c.rms_eps);
    let n_vocab = output.ne[1];
    let rows = match which {
        Logits::All => 0..n,
        Logits::Last => n - 1..n,
        Logits::None => {
            return Ok(HeadOut {
                logits: Vec::new(),
                hidden: None,
            })
        }
    };
    let n_out = rows.len();
    let dev = output.device;
    if let Some(gpu) = p.devices.gpu(dev) {
        let gpu = gpu.clone();
        let xp = x.on_gpu(dev)?;
        let h = p.gpu.buf(dev, "h", n * e)?;
        let norm = norm.ptr("output_norm")?;
        gpu.rms_norm(
            xp.offset::<f32>(rows.start * e),
            e,
            norm,
            h,
            e,
            n_out,
            e,
            eps,
        )?;
        let logits = p.gpu.buf(dev, "logits", n_out * n_vocab)?;
        gpu.mul_mat(&weight(output)?, 1, h, e, 0, logits, n_vocab, 0, n_out)?;
        let mut host = vec![0f32; n_out * n_vocab];
        gpu.backend()
            .download(logits, bytemuck::cast_slice_mut(&mut host))?;
        p.devices.count_copy(dev, CPU, host.len() * F32);
        let hidden = if want_hidden {
            let mut rows = vec![0f32; n_out * e];
            gpu.backend()
                .download(h, bytemuck::cast_slice_mut(&mut rows))?;
            p.devices.count_copy(dev, CPU, rows.len() * F32);
            Some(rows)
        } else {
            None
        };
        return Ok(HeadOut {
            logits: host,
            hidden,
        });
    }
    if norm.len() != e {
        return Err(Error::Model(format!(
            "the output norm has {} values for a hidden size of {e}",
            norm.len()
        )));
    }
    let xs = x.on(dev)?;
    let rows = &mut xs[rows.start * e..rows.end * e];
    ops::rms_norm_mul(rows, norm, eps);
    let mut logits = vec![0f32; n_out * n_vocab];
    output.matrix()?.matmul(p.par, rows, &mut logits);
    let mut hidden = want_hidden.then(|| rows.to_vec());
    if dev != CPU {
        // The logits (and rows) come back to the host.
        let mut host = Vec::new();
        p.devices.copy(dev, &logits, CPU, &mut host);
        logits = host;
        if let Some(h) = &mut hidden {
            p.devices.count_copy(dev, CPU, h.len() * F32);
        }
    }
    Ok(HeadOut { logits, hidden })
}
