//! The output head: the final RMS norm and the projection to vocabulary logits, for the rows
//! the caller asks for; the logits come back to the host for sampling.

use crate::device::{DeviceId, Resident, CPU};
use crate::forward::Pass;
use crate::gpu_pass::{weight, F32};
use crate::loader::Vector;
use crate::model::Logits;
use crate::ops;
use crate::tensor::Tensor;
use crate::Result;

pub struct OutputHead {
    pub norm: Vector,
    /// `output` (or the token embeddings, when the model ties them).
    pub output: Tensor,
}

impl OutputHead {
    pub fn device(&self) -> DeviceId {
        self.output.device
    }

    /// The logits of the rows `which` asks for (`n_vocab` each), on the host.
    pub(crate) fn run(&self, p: &mut Pass, x: &mut Resident, which: Logits) -> Result<Vec<f32>> {
        let (n, e, eps) = (p.n, p.c.n_embd, p.c.rms_eps);
        let n_vocab = self.output.ne[1];
        let rows = match which {
            Logits::All => 0..n,
            Logits::Last => n - 1..n,
            Logits::None => return Ok(Vec::new()),
        };
        let n_out = rows.len();
        let dev = self.device();
        if let Some(gpu) = p.devices.gpu(dev) {
            let gpu = gpu.clone();
            let xp = x.on_gpu(dev)?;
            let h = p.gpu.buf(dev, "h", n * e)?;
            let norm = self.norm.ptr("output_norm")?;
            gpu.rms_norm(
                xp + (rows.start * e * F32) as u64,
                e,
                norm,
                h,
                e,
                n_out,
                e,
                eps,
            )?;
            let logits = p.gpu.buf(dev, "logits", n_out * n_vocab)?;
            gpu.mul_mat(
                &weight(&self.output)?,
                1,
                h,
                e,
                0,
                logits,
                n_vocab,
                0,
                n_out,
            )?;
            let mut host = vec![0f32; n_out * n_vocab];
            gpu.backend()
                .download(logits, bytemuck::cast_slice_mut(&mut host))?;
            p.devices.count_copy(dev, CPU, host.len() * F32);
            return Ok(host);
        }
        let xs = x.on(dev)?;
        let rows = &mut xs[rows.start * e..rows.end * e];
        ops::rms_norm_mul(rows, &self.norm, eps);
        let mut logits = vec![0f32; n_out * n_vocab];
        self.output.matrix()?.matmul(p.par, rows, &mut logits);
        if dev != CPU {
            // The logits come back to the host for sampling.
            let mut host = Vec::new();
            p.devices.copy(dev, &logits, CPU, &mut host);
            return Ok(host);
        }
        Ok(logits)
    }
}
