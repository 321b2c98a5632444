//! PLACEHOLDER until the gpu-quant branch lands (same API).
use moxie_quant::GgmlType;

use crate::{DevPtr, Error, Gpu, Result};

/// A weight tensor in device memory.
#[derive(Clone, Copy, Debug)]
pub struct Weight {
    pub ptr: DevPtr,
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    pub n_mat: usize,
}

#[allow(clippy::too_many_arguments, unused_variables)]
impl Gpu {
    pub fn supports(ty: GgmlType) -> bool {
        false
    }
    pub fn mul_mat(
        &self,
        w: &Weight,
        n_batch: usize,
        x: DevPtr,
        ldx: usize,
        x_batch: usize,
        y: DevPtr,
        ldy: usize,
        y_batch: usize,
        n_tok: usize,
    ) -> Result<()> {
        Err(Error::Unsupported("placeholder".into()))
    }
    pub fn mul_mat_id(
        &self,
        w: &Weight,
        ids: DevPtr,
        n_ids: usize,
        x: DevPtr,
        ldx: usize,
        x_div: usize,
        y: DevPtr,
        ldy: usize,
    ) -> Result<()> {
        Err(Error::Unsupported("placeholder".into()))
    }
    pub fn get_rows(&self, w: &Weight, rows: DevPtr, n: usize, out: DevPtr) -> Result<()> {
        Err(Error::Unsupported("placeholder".into()))
    }
}
