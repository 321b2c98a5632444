//! PLACEHOLDER until the gpu-emu branch lands.
