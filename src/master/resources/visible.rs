//! The operator's `CUDA_VISIBLE_DEVICES`: the devices vramfork may plan on. NVML does not
//! read the variable (it always lists every GPU), and each worker's own
//! `CUDA_VISIBLE_DEVICES` is set to the UUID of its device, so the operator's choice must
//! be applied here, to what NVML listed, or it would be silently ignored.
//!
//! The rules follow CUDA's ("CUDA Environment Variables" in the CUDA C++ Programming Guide):
//! a comma-separated list of entries; an entry is a device index or a UUID (`GPU-…` for a
//! GPU, `MIG-…` for a MIG instance, any unique prefix of one); an empty value hides every
//! GPU; the list ends at the first entry that names no device, and later entries are
//! ignored. Indices are taken in NVML's order (`nvidia-smi`'s), which is CUDA's when
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`; an index of a GPU in MIG mode selects its MIG instances.
//! UUIDs are exact whatever the order, and are what this module recommends.

use super::{GpuInfo, Resources};

/// `res` with only the devices `spec` (the value of `CUDA_VISIBLE_DEVICES`) names, in the
/// order NVML listed them; what was left out and why is added to the GPU note.
pub fn restrict(mut res: Resources, spec: Option<&str>) -> Resources {
    let Some(spec) = spec else {
        return res;
    };
    let mut keep: Vec<u32> = Vec::new();
    let mut stopped_at: Option<String> = None;
    // An empty value hides every GPU; an empty entry in a list ("0,1,") names nothing.
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let chosen: Vec<u32> = res
            .gpus
            .iter()
            .filter(|g| names(entry, g))
            .map(|g| g.index)
            .collect();
        let unique_uuid = entry.parse::<u32>().is_ok() || chosen.len() <= 1;
        if chosen.is_empty() || !unique_uuid {
            stopped_at = Some(entry.to_string());
            break;
        }
        for i in chosen {
            if !keep.contains(&i) {
                keep.push(i);
            }
        }
    }
    let left_out: Vec<String> = res
        .gpus
        .iter()
        .filter(|g| !keep.contains(&g.index))
        .map(GpuInfo::label)
        .collect();
    res.gpus.retain(|g| keep.contains(&g.index));
    let mut notes: Vec<String> = res.gpu_note.take().into_iter().collect();
    if let Some(bad) = stopped_at {
        notes.push(format!(
            "CUDA_VISIBLE_DEVICES={spec}: '{bad}' names no GPU (or more than one), so it and \
             every entry after it are ignored, as CUDA does"
        ));
    }
    if !left_out.is_empty() {
        notes.push(format!(
            "CUDA_VISIBLE_DEVICES={spec} leaves out {}",
            left_out.join(", ")
        ));
    }
    res.gpu_note = (!notes.is_empty()).then(|| notes.join("; "));
    res
}

/// Whether one entry of the list names device `g`.
fn names(entry: &str, g: &GpuInfo) -> bool {
    if let Ok(i) = entry.parse::<u32>() {
        return g.nvml_index() == i;
    }
    let is_uuid = entry.starts_with("GPU-") || entry.starts_with("MIG-");
    is_uuid && entry.len() > 4 && g.uuid.starts_with(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::resources::{MigInstance, MB};

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            index,
            uuid: uuid.into(),
            name: "Test GPU".into(),
            total_bytes: 1000 * MB,
            free_bytes: 1000 * MB,
            ..GpuInfo::default()
        }
    }

    fn machine() -> Resources {
        let mut mig = gpu(3, "MIG-aaaa-1111");
        mig.mig = Some(MigInstance { parent: 2, slot: 0 });
        let mut mig2 = gpu(4, "MIG-bbbb-2222");
        mig2.mig = Some(MigInstance { parent: 2, slot: 1 });
        Resources {
            cpus: 8,
            gpus: vec![gpu(0, "GPU-0000-aaaa"), gpu(1, "GPU-1111-bbbb"), mig, mig2],
            gpu_note: None,
            driver_version: None,
            cuda_driver_version: None,
        }
    }

    fn kept(spec: Option<&str>) -> (Vec<u32>, Option<String>) {
        let r = restrict(machine(), spec);
        (r.gpus.iter().map(|g| g.index).collect(), r.gpu_note)
    }

    #[test]
    fn unset_keeps_everything() {
        assert_eq!(kept(None), (vec![0, 1, 3, 4], None));
    }

    #[test]
    fn indices_uuids_and_prefixes_choose_devices() {
        let (k, note) = kept(Some("1"));
        assert_eq!(k, vec![1]);
        let note = note.unwrap();
        assert!(
            note.contains("leaves out GPU 0, GPU 2 MIG 0, GPU 2 MIG 1"),
            "{note}"
        );
        assert_eq!(kept(Some("GPU-1111-bbbb,0")).0, vec![0, 1]);
        assert_eq!(kept(Some("GPU-1111")).0, vec![1]);
        assert_eq!(kept(Some("MIG-bbbb")).0, vec![4]);
        // An index of a GPU in MIG mode: its instances.
        assert_eq!(kept(Some("2")).0, vec![3, 4]);
    }

    #[test]
    fn empty_hides_every_gpu() {
        let (k, note) = kept(Some(""));
        assert!(k.is_empty());
        assert!(note.unwrap().contains("leaves out GPU 0, GPU 1"));
    }

    #[test]
    fn the_list_ends_at_the_first_entry_naming_nothing() {
        let (k, note) = kept(Some("0,7,1"));
        assert_eq!(k, vec![0]);
        let note = note.unwrap();
        assert!(note.contains("'7' names no GPU"), "{note}");
        // An ambiguous prefix names more than one: it ends the list too.
        assert_eq!(kept(Some("1,GPU-")).0, vec![1]);
        // A trailing comma is no entry.
        assert_eq!(
            kept(Some("0,1,")),
            (
                vec![0, 1],
                Some("CUDA_VISIBLE_DEVICES=0,1, leaves out GPU 2 MIG 0, GPU 2 MIG 1".into())
            )
        );
        assert_eq!(kept(Some("MIG-,0")).0, Vec::<u32>::new());
    }
}
