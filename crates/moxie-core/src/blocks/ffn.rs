//! The gated (SwiGLU) feed-forward block: `down(silu(gate(h)) * up(h))`. The dense FFN of
//! leading dense layers, and the shared expert of MoE layers.

use moxie_gpu::{DevPtr, Gpu};

use crate::blocks::matmul_shared;
use crate::device::DeviceId;
use crate::forward::{Block, Pass};
use crate::gpu_pass::{weight, GpuPass};
use crate::ops;
use crate::parallel::Parallel;
use crate::state::LayerState;
use crate::tensor::{QuantizedActs, Tensor};
use crate::Result;

pub struct DenseFfn {
    /// Where its weights are.
    pub device: DeviceId,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

impl DenseFfn {
    pub fn matrices(&self) -> [&Tensor; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// [`DenseFfn::matrices`], to replace (load-time repacking).
    pub fn matrices_mut(&mut self) -> [&mut Tensor; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }

    /// The FFN of `h` (`n` rows) on the host. `input` is `h` already converted for another
    /// matrix (the MoE layer's expert input); it is reused when it has the gate's activation
    /// type.
    pub(crate) fn cpu_rows(
        &self,
        h: &[f32],
        n: usize,
        input: Option<&QuantizedActs>,
        par: &Parallel,
    ) -> Result<crate::scratch::Buf> {
        let gate = self.gate.matrix()?;
        let n_ff = gate.n_out;
        let own;
        let acts = match input {
            Some(a) if a.ty == gate.act_type() => a,
            _ => {
                own = QuantizedActs::new(par, gate.act_type(), gate.n_in, h);
                &own
            }
        };
        // From the thread's pool: the products write every value.
        let mut g = crate::scratch::take(n * n_ff);
        let mut u = crate::scratch::take(n * n_ff);
        gate.matmul_q(par, acts, &mut g);
        matmul_shared(&self.up, acts, h, par, &mut u)?;
        ops::for_each_row(par, &mut g, n_ff, 8 * n_ff, |t, row| {
            ops::swiglu(row, &u[t * n_ff..(t + 1) * n_ff])
        });
        let down = self.down.matrix()?;
        drop(u);
        let mut out = crate::scratch::take(n * down.n_out);
        down.matmul(par, &g, &mut out);
        Ok(out)
    }

    /// The FFN of `h` (`n` rows in GPU `id`'s memory) into a work buffer there.
    pub(crate) fn gpu_rows(
        &self,
        g: &mut GpuPass,
        gpu: &Gpu,
        id: DeviceId,
        h: DevPtr,
        n: usize,
    ) -> Result<DevPtr> {
        let gate = weight(&self.gate)?;
        let n_ff = gate.n_out;
        let gb = g.buf(id, "ffn_gate", n * n_ff)?;
        let ub = g.buf(id, "ffn_up", n * n_ff)?;
        let up = weight(&self.up)?;
        gpu.mul_mats(&[(&gate, gb, n_ff), (&up, ub, n_ff)], h, gate.n_in, n)?;
        gpu.swiglu(gb, ub, n * n_ff)?;
        let down = weight(&self.down)?;
        let o = g.buf(id, "ffn_out", n * down.n_out)?;
        gpu.mul_mat(&down, 1, gb, n_ff, 0, o, down.n_out, 0, n)?;
        Ok(o)
    }
}

impl Block for DenseFfn {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], _: &mut LayerState) -> Result<()> {
        ops::add_assign_par(p.par, x, &self.cpu_rows(h, p.n, None, p.par)?);
        Ok(())
    }

    fn gpu(
        &self,
        p: &mut Pass,
        id: DeviceId,
        h: DevPtr,
        x: DevPtr,
        _: &mut LayerState,
    ) -> Result<()> {
        let gpu = p.gpu.gpu(id)?;
        let o = self.gpu_rows(&mut p.gpu, &gpu, id, h, p.n)?;
        gpu.add(x, o, p.n * p.c.n_embd)?;
        Ok(())
    }
}
