//! PLACEHOLDER until the gpu-cuda branch lands.
