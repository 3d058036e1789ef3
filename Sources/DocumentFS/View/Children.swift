import FUSE
import Synchronization

/// The entries of a directory in the mount, by name, with what per-operation checks need kept up
/// to date as entries come and go: the entry whose name is a given text (the store compares names
/// as text, so a create must find a name in another Unicode form), and how many entries are
/// directories (a directory's link count). Both are O(1), whatever the size of the directory.
struct Children: Sequence {
    private var byName: [FUSE.FileName: ViewNode] = [:]
    /// Swift compares and hashes strings by canonical equivalence: one key per text.
    private var byText: [String: ViewNode] = [:]
    private(set) var directoryCount = 0
    /// Changes whenever an entry comes, goes or is replaced; unique across all directories, so a
    /// listing cached for one generation is never taken for another's.
    private(set) var generation: UInt64

    private static let generations = Atomic<UInt64>(0)

    init() { generation = Self.generations.add(1, ordering: .relaxed).newValue }

    subscript(name: FUSE.FileName) -> ViewNode? {
        get { byName[name] }
        set {
            if let old = byName[name] {
                if old.kind == .directory { directoryCount -= 1 }
                let text = name.string
                if byText[text] === old { byText[text] = nil }
            }
            byName[name] = newValue
            generation = Self.generations.add(1, ordering: .relaxed).newValue
            if let newValue {
                if newValue.kind == .directory { directoryCount += 1 }
                byText[name.string] = newValue
            }
        }
    }

    /// The entry whose name is `text` in any Unicode form.
    func entry(equivalentTo text: String) -> ViewNode? { byText[text] }

    var values: Dictionary<FUSE.FileName, ViewNode>.Values { byName.values }
    var isEmpty: Bool { byName.isEmpty }
    var count: Int { byName.count }

    func filter(_ isIncluded: ((key: FUSE.FileName, value: ViewNode)) throws -> Bool) rethrows -> Children {
        var result = Children()
        for entry in byName where try isIncluded(entry) { result[entry.key] = entry.value }
        return result
    }

    func makeIterator() -> Dictionary<FUSE.FileName, ViewNode>.Iterator { byName.makeIterator() }
}
