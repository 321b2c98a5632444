//! Token embeddings: a row of `token_embd` per token, the hidden state the layers start from.

use crate::device::{Resident, CPU};
use crate::forward::Pass;
use crate::gpu_pass::weight;
use crate::tensor::Tensor;
use crate::Result;

pub struct Embeddings {
    pub tok_embd: Tensor,
}

impl Embeddings {
    /// The rows of `tokens`, on the device holding the table.
    pub(crate) fn run<'m>(&self, p: &mut Pass<'m>, tokens: &[u32]) -> Result<Resident<'m>> {
        Self::rows(&self.tok_embd, p, tokens)
    }

    /// The rows of `tokens` in embedding table `table`, on the device holding it.
    pub(crate) fn rows<'m>(
        table: &Tensor,
        p: &mut Pass<'m>,
        tokens: &[u32],
    ) -> Result<Resident<'m>> {
        let dev = table.device;
        let n_embd = table.ne[0];
        if let Some(gpu) = p.devices.gpu(dev) {
            let gpu = gpu.clone();
            let mut x = Resident::new(p.devices, CPU, Vec::new());
            let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
            let ids_dev = p.gpu.buf(dev, "token_ids", ids.len())?;
            gpu.backend().upload(ids_dev, bytemuck::cast_slice(&ids))?;
            p.devices.count_copy(CPU, dev, ids.len() * 4);
            let xp = x.loaded_on_gpu(dev, tokens.len() * n_embd)?;
            gpu.get_rows(&weight(table)?, ids_dev, tokens.len(), xp)?;
            return Ok(x);
        }
        let mut x0 = vec![0f32; tokens.len() * n_embd];
        for (&t, row) in tokens.iter().zip(x0.chunks_exact_mut(n_embd)) {
            table.row_to_f32(t as usize, row)?;
        }
        Ok(Resident::new(p.devices, dev, x0))
    }
}
