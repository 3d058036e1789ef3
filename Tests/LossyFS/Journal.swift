import FUSE

/// A name in a directory of the backing folder: the directory's inode number and the name.
struct Slot: Hashable {
    var directory: UInt64
    var name: FileName
}

/// An inode a slot can hold.
struct Object: Hashable {
    var ino: UInt64
    var isDirectory: Bool
}

/// What one system call did to one slot: it held `before` and holds `after` (nil: nothing).
struct Change: Hashable {
    var slot: Slot
    var before: Object?
    var after: Object?
}

/// The name changes of one system call (two slots for a rename or an exchange), applied to the
/// backing folder at once and undone at a power cut unless they became durable first.
struct Record {
    var sequence: UInt64
    var changes: [Change]
    /// Creates, removes or moves a directory (mkdir, rmdir, rename of a directory).
    var changesTree: Bool
}

/// The name changes not yet durable, oldest first.
///
/// **When a change becomes durable** (and leaves the journal):
/// - `fsync` of a directory: every record with a change in it;
/// - `fsync` or `fdatasync` of a file (unless `posixNames`): every record that gave the file a
///   name (as ext4 commits a new file's directory entry with the file);
/// - a clean unmount, or the "sync" signal: every record.
///
/// **Closure.** A record becomes durable only with every older record that changed one of its
/// slots, and a record that changes the directory tree only with every older record: so the
/// durable records, replayed in order, find each slot as it was when the call ran, and the
/// directories form a tree that existed at some moment. Undoing the others, newest first,
/// yields that state. A name in a directory whose own name is not durable goes with it.
struct NameJournal {
    private var records: [UInt64: Record] = [:]
    private var bySlot: [Slot: [UInt64]] = [:]
    private var byDirectory: [UInt64: Set<UInt64>] = [:]
    private var byNamedObject: [UInt64: Set<UInt64>] = [:]
    /// How many records still hold each inode as a `before`: an undo would put it back, so its
    /// copy in limbo must stay.
    private var restorable: [UInt64: Int] = [:]
    private var nextSequence: UInt64 = 1

    var isEmpty: Bool { records.isEmpty }
    var count: Int { records.count }

    /// Whether an undo may still need `ino` back.
    func needs(_ ino: UInt64) -> Bool { restorable[ino, default: 0] > 0 }

    mutating func append(_ changes: [Change], changesTree: Bool) {
        let sequence = nextSequence
        nextSequence += 1
        records[sequence] = Record(sequence: sequence, changes: changes, changesTree: changesTree)
        for change in changes {
            bySlot[change.slot, default: []].append(sequence)
            byDirectory[change.slot.directory, default: []].insert(sequence)
            if let after = change.after { byNamedObject[after.ino, default: []].insert(sequence) }
            if let before = change.before { restorable[before.ino, default: 0] += 1 }
        }
    }

    /// `fsync` of the directory `ino`. Returns the inodes no undo can need any more.
    mutating func syncDirectory(_ ino: UInt64) -> [UInt64] {
        makeDurable(byDirectory[ino] ?? [])
    }

    /// `fsync` of the file `ino`: the records that gave it a name. Returns as ``syncDirectory(_:)``.
    mutating func syncNames(of ino: UInt64) -> [UInt64] {
        makeDurable(byNamedObject[ino] ?? [])
    }

    /// Everything (a clean unmount). Returns as ``syncDirectory(_:)``.
    mutating func syncAll() -> [UInt64] {
        makeDurable(Set(records.keys))
    }

    /// The records still to undo at a power cut, newest first.
    var undoOrder: [Record] {
        records.keys.sorted(by: >).compactMap { records[$0] }
    }

    /// Marks `sequences` and their closure durable and drops them.
    private mutating func makeDurable(_ sequences: Set<UInt64>) -> [UInt64] {
        var durable: Set<UInt64> = []
        var work = Array(sequences)
        while let sequence = work.popLast() {
            guard let record = records[sequence], durable.insert(sequence).inserted else { continue }
            if record.changesTree {
                work += records.keys.filter { $0 < sequence && !durable.contains($0) }
            }
            for change in record.changes {
                for older in bySlot[change.slot] ?? [] {
                    if older >= sequence { break }
                    if !durable.contains(older) { work.append(older) }
                }
            }
        }
        var released: [UInt64] = []
        for sequence in durable {
            guard let record = records.removeValue(forKey: sequence) else { continue }
            for change in record.changes {
                bySlot[change.slot]?.removeAll { $0 == sequence }
                if bySlot[change.slot]?.isEmpty == true { bySlot[change.slot] = nil }
                byDirectory[change.slot.directory]?.remove(sequence)
                if byDirectory[change.slot.directory]?.isEmpty == true {
                    byDirectory[change.slot.directory] = nil
                }
                if let after = change.after {
                    byNamedObject[after.ino]?.remove(sequence)
                    if byNamedObject[after.ino]?.isEmpty == true { byNamedObject[after.ino] = nil }
                }
                if let before = change.before {
                    restorable[before.ino, default: 1] -= 1
                    if restorable[before.ino] == 0 {
                        restorable[before.ino] = nil
                        released.append(before.ino)
                    }
                }
            }
        }
        return released
    }
}
