//! A non-executable arena for code compiled for another architecture (inspection, dumps,
//! cross-compile tests). Same `CodeArena` contract, plain heap memory.

use packjit_plugin_api::{CodeArena, CompileError, ErrorKind, Region};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
pub(crate) struct HeapArena {
    blocks: Mutex<HashMap<u64, Box<[u8]>>>,
    next: Mutex<u64>,
}

impl HeapArena {
    fn blocks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Box<[u8]>>> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn read(&self, region: &Region, len: usize) -> Vec<u8> {
        self.blocks()
            .get(&region.cookie)
            .map(|b| b[..len.min(b.len())].to_vec())
            .unwrap_or_default()
    }
}

impl CodeArena for HeapArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        if size == 0 {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "zero-sized code allocation",
            ));
        }
        let size = size.div_ceil(64) * 64;
        let block = vec![0u8; size].into_boxed_slice();
        let cookie = {
            let mut n = self.next.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        // The "executable" address is the block's heap address: unique and stable, and the
        // code is position-independent anyway.
        let region = Region {
            exec_addr: block.as_ptr() as u64,
            size: size as u64,
            cookie,
        };
        self.blocks().insert(cookie, block);
        Ok(region)
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        let mut blocks = self.blocks();
        let block = blocks
            .get_mut(&region.cookie)
            .ok_or_else(|| CompileError::new(ErrorKind::Arena, "region is not from this arena"))?;
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= block.len())
            .ok_or_else(|| CompileError::new(ErrorKind::Arena, "write overflows the region"))?;
        block[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    fn free(&self, region: &Region) {
        self.blocks().remove(&region.cookie);
    }
}
