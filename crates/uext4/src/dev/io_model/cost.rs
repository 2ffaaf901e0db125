//! What a request would cost on a real disk: a rotating disk and an SSD.
//!
//! Both models take requests in the order they are issued and serve them one at
//! a time (queue depth 1, no reordering, write cache off: every write reaches
//! the medium before the next request starts, so a flush costs nothing more).
//! uext4 issues its metadata sorted by block (commits, checkpoints and
//! write-back sort their buffers), which is what an elevator would do for it.
//! The figures are for comparing layouts, not for predicting a given machine.

/// A request as the models see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

/// A disk cost model: seconds per request, in issue order.
pub trait DiskModel: Send {
    /// The time the disk takes to serve `len` bytes at byte `offset`.
    fn serve(&mut self, direction: Direction, offset: u64, len: u64) -> f64;
}

/// The parameters of a rotating disk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotatingDiskParams {
    /// The whole disk: seek distances are fractions of its stroke. The image is a
    /// partition at its start (the outer, fastest tracks).
    pub capacity_bytes: u64,
    pub rpm: f64,
    /// Seek to the next track, settling included.
    pub track_to_track_s: f64,
    /// Average seek over random positions (one third of the stroke).
    pub average_seek_s: f64,
    /// Sustained media transfer rate.
    pub transfer_bytes_per_s: f64,
}

impl RotatingDiskParams {
    /// A 7200 rpm SATA disk of 2007, the kind both seeds measured on (seed 000:
    /// "a 7200 RPM SATA PC", 50 GB partition): Seagate Barracuda 7200.10
    /// ST3320620AS, 320 GB. Rotation 7200 rpm (8.33 ms a turn, 4.17 ms average
    /// latency); average read seek 11 ms and track-to-track 0.8 ms as the
    /// Barracuda 7200.10 product manual gives them (quoted from it as
    /// remembered, not re-checked against a copy here); sustained transfer
    /// 62 MB/s, the average HD Tune measured across an ST3320620A
    /// (goughlui.com, "Seagate ST3320620A Barracuda 7200.10"). Full stroke
    /// follows from the seek curve below: 0.8 + 10.2 * sqrt(3) = 18.5 ms.
    pub const SEED_7200_RPM_SATA: RotatingDiskParams = RotatingDiskParams {
        capacity_bytes: 320_072_933_376,
        rpm: 7200.0,
        track_to_track_s: 0.0008,
        average_seek_s: 0.011,
        transfer_bytes_per_s: 62.0e6,
    };

    fn revolution_s(&self) -> f64 {
        60.0 / self.rpm
    }

    /// Bytes passing under the head in one revolution: one track.
    fn track_bytes(&self) -> f64 {
        self.transfer_bytes_per_s * self.revolution_s()
    }

    /// Seek time for a head movement of `distance` bytes: short seeks grow with
    /// the square root of the distance (the arm accelerates, then brakes), as in
    /// Ruemmler and Wilkes, "An introduction to disk drive modeling" (IEEE
    /// Computer, 1994); the curve passes through track-to-track at one track and
    /// the average seek at a third of the stroke.
    pub fn seek_s(&self, distance: u64) -> f64 {
        let fraction = (distance as f64 / self.capacity_bytes as f64).min(1.0);
        self.track_to_track_s + (self.average_seek_s - self.track_to_track_s) * (fraction * 3.0).sqrt()
    }
}

/// A rotating disk serving requests one by one: a request that starts where the
/// previous one ended streams on; one a little further along the same track
/// waits for the gap to pass under the head; a little behind, for nearly a turn;
/// anywhere else costs a seek and, on average, half a turn.
pub struct RotatingDisk {
    params: RotatingDiskParams,
    /// Byte offset just after the last request served.
    head: Option<u64>,
}

impl RotatingDisk {
    pub fn new(params: RotatingDiskParams) -> RotatingDisk {
        RotatingDisk { params, head: None }
    }

    pub fn params(&self) -> &RotatingDiskParams {
        &self.params
    }

    fn positioning_s(&self, offset: u64) -> f64 {
        let p = &self.params;
        let Some(head) = self.head else {
            return p.average_seek_s + p.revolution_s() / 2.0;
        };
        let track = p.track_bytes();
        if offset >= head && ((offset - head) as f64) < track {
            return (offset - head) as f64 / p.transfer_bytes_per_s;
        }
        if offset < head && ((head - offset) as f64) < track {
            return p.revolution_s() - (head - offset) as f64 / p.transfer_bytes_per_s;
        }
        p.seek_s(offset.abs_diff(head)) + p.revolution_s() / 2.0
    }
}

impl DiskModel for RotatingDisk {
    fn serve(&mut self, _direction: Direction, offset: u64, len: u64) -> f64 {
        let cost = self.positioning_s(offset) + len as f64 / self.params.transfer_bytes_per_s;
        self.head = Some(offset + len);
        cost
    }
}

/// The parameters of an SSD: a fixed cost per request (the latency of one 4 KiB
/// request at queue depth 1, which includes its own transfer) plus the transfer
/// of anything beyond 4 KiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SolidStateParams {
    pub read_request_s: f64,
    pub write_request_s: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
}

impl SolidStateParams {
    /// A SATA SSD: Samsung 860 EVO, from its data sheet: 4 KiB random read at
    /// queue depth 1 up to 10,000 IOPS (0.1 ms) and random write up to 42,000
    /// IOPS (24 us); sequential read 550 MB/s and write 520 MB/s.
    pub const SATA_SSD: SolidStateParams = SolidStateParams {
        read_request_s: 1.0 / 10_000.0,
        write_request_s: 1.0 / 42_000.0,
        read_bytes_per_s: 550.0e6,
        write_bytes_per_s: 520.0e6,
    };
}

pub struct SolidState {
    params: SolidStateParams,
}

impl SolidState {
    pub fn new(params: SolidStateParams) -> SolidState {
        SolidState { params }
    }

    pub fn params(&self) -> &SolidStateParams {
        &self.params
    }
}

impl DiskModel for SolidState {
    fn serve(&mut self, direction: Direction, _offset: u64, len: u64) -> f64 {
        let p = &self.params;
        let beyond = len.saturating_sub(4096) as f64;
        match direction {
            Direction::Read => p.read_request_s + beyond / p.read_bytes_per_s,
            Direction::Write => p.write_request_s + beyond / p.write_bytes_per_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_is_cheap_and_seeks_grow_with_distance() {
        let p = RotatingDiskParams::SEED_7200_RPM_SATA;
        let mut disk = RotatingDisk::new(p);
        disk.serve(Direction::Write, 0, 4096);
        let streamed = disk.serve(Direction::Write, 4096, 4096);
        assert!((streamed - 4096.0 / 62.0e6).abs() < 1e-9, "{streamed}");
        let near = disk.serve(Direction::Write, 8192 + 40960, 4096);
        assert!(near < 0.001, "a gap on the same track costs its passing: {near}");
        let behind = disk.serve(Direction::Write, 8192, 4096);
        assert!(behind > 0.007, "just behind the head costs nearly a turn: {behind}");
        assert!(p.seek_s(1 << 30) < p.seek_s(100 << 30));
        assert!((p.seek_s(p.capacity_bytes / 3) - 0.011).abs() < 1e-9, "the average seek at a third of the stroke");
        let far = disk.serve(Direction::Read, 200 << 30, 4096);
        assert!(far > 0.011, "{far}");

        let mut ssd = SolidState::new(SolidStateParams::SATA_SSD);
        assert!((ssd.serve(Direction::Read, 0, 4096) - 1e-4).abs() < 1e-12);
        assert!(ssd.serve(Direction::Write, 0, 1 << 20) > ssd.serve(Direction::Write, 0, 4096));
    }
}
