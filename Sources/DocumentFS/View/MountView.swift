import FUSE
import Foundation
import Logging
import Synchronization
import Threading
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// What every room of the mount shares: the store, the kernel's node table, and the view tree
/// under its one lock (``ViewState``). It holds no room's own state and calls no room.
final class MountView: Sendable {
    let store: any FileSystemStore
    let configuration: DocumentFileSystem.Configuration
    let logger: Logger
    let table: NodeTable<UInt64>
    let state = Locked(.view, ViewState())
    /// Owner of the mount root, from the store file when it is a local file.
    let rootOwner: (uid: UInt32, gid: UInt32)
    /// Where written chunks are kept until saved.
    let spillFiles: SpillFiles
    /// The folder of the store file; empty for a store that is not a local file.
    let storeDirectory: String
    let chunkSize: Int
    /// Whether the kernel took the writeback cache in `INIT`.
    let writeback = Atomic<Bool>(false)
    /// File systems made by this process, to tell their origins apart.
    private static let instances = Atomic<Int>(0)
    /// Who saved, in the store's history: unique to this mount, so its own events are told
    /// apart from other processes' (another mount of the same store included).
    let origin: String

    init(store: any FileSystemStore, configuration: DocumentFileSystem.Configuration, logger: Logger) {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        chunkSize = store.chunkSize
        let instance = Self.instances.add(1, ordering: .relaxed).newValue
        let host = ProcessInfo.processInfo.hostName
        origin = "\(configuration.origin) (\(host) pid \(getpid())\(instance > 1 ? ".\(instance)" : ""))"
        var st = stat()
        if stat(store.location, &st) == 0 {
            rootOwner = (st.st_uid, st.st_gid)
        } else {
            rootOwner = (getuid(), getgid())
        }
        // Only a store that is a local file has a folder (corelibs' deletingLastPathComponent traps
        // on a name without a slash, such as a store in memory).
        storeDirectory =
            store.location.hasPrefix("/") ? (store.location as NSString).deletingLastPathComponent : ""
        var isDirectory: ObjCBool = false
        if let given = configuration.spillDirectory {
            spillFiles = SpillFiles(directory: given, memoryBudget: configuration.memoryForSmallFiles)
        } else if !storeDirectory.isEmpty,
            FileManager.default.fileExists(atPath: storeDirectory, isDirectory: &isDirectory),
            isDirectory.boolValue, Glibc.access(storeDirectory, W_OK) == 0
        {
            spillFiles = SpillFiles(
                directory: storeDirectory, memoryBudget: configuration.memoryForSmallFiles)
        } else {
            spillFiles = SpillFiles(
                directory: NSTemporaryDirectory(), memoryBudget: configuration.memoryForSmallFiles)
        }
        let forgotten = ForgetRelay()
        table = NodeTable(root: mountRootInode) { ino, _ in forgotten.target?.forgotten(ino) }
        forgotten.connect(self)
    }
}

/// A part of the mount: it reaches the shared view through ``view`` and owns whatever else it
/// keeps. The helpers in the extensions of this protocol are the view's operations.
protocol MountRoom: Sendable {
    var view: MountView { get }
}

extension MountRoom {
    typealias State = ViewState
    var store: any FileSystemStore { view.store }
    var configuration: DocumentFileSystem.Configuration { view.configuration }
    var logger: Logger { view.logger }
    var table: NodeTable<UInt64> { view.table }
    var state: Locked<ViewState> { view.state }
    var rootOwner: (uid: UInt32, gid: UInt32) { view.rootOwner }
    var spillFiles: SpillFiles { view.spillFiles }
    var storeDirectory: String { view.storeDirectory }
    var chunkSize: Int { view.chunkSize }
    var origin: String { view.origin }
}

extension MountView: MountRoom {
    var view: MountView { self }
}

/// Lets the node table's forget callback reach the view created after it.
private final class ForgetRelay: Sendable {
    private struct Reference { weak var view: MountView? }
    private let reference = Mutex(Reference())

    var target: MountView? { reference.withLock { $0.view } }

    func connect(_ view: MountView) { reference.withLock { $0.view = view } }
}
