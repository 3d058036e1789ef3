import Dispatch
import DocumentEngine
import Foundation
import Synchronization
import Testing

/// FileWrapper is used from FUSE worker threads and app threads at once.
@Suite struct FileWrapperConcurrencyTests {
    @Test("Concurrent first accesses of a lazy directory all see the same children")
    func concurrentLazyLoad() throws {
        let tmp = try TemporaryDirectory()
        for i in 0..<200 { try tmp.write("pkg/f\(i)", "\(i)") }
        for _ in 0..<20 {
            let w = try FileWrapper(url: tmp.url("pkg"))
            let results = Locked<[[String: ObjectIdentifier]]>([])
            DispatchQueue.concurrentPerform(iterations: 8) { _ in
                let children = (try? w.children()) ?? [:]
                results.withLock { $0.append(children.mapValues(ObjectIdentifier.init)) }
            }
            let all = results.withLock { $0 }
            #expect(all.count == 8)
            #expect(all.allSatisfy { $0 == all[0] && $0.count == 200 })
        }
    }

    @Test("Concurrent adds, removes and renames keep keys unique and consistent")
    func concurrentMutation() throws {
        let dir = FileWrapper(directoryWithFileWrappers: [:])
        let kept = Locked<[FileWrapper]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            var mine: [FileWrapper] = []
            for i in 0..<300 {
                let child = FileWrapper(regularFileWithContents: Data("\(thread)-\(i)".utf8))
                child.preferredFilename = "item\(i % 7).txt"
                dir.addFileWrapper(child)
                mine.append(child)
                if i % 3 == 0, let victim = mine.popLast() { dir.removeFileWrapper(victim) }
                if i % 5 == 0, let renamed = mine.last { renamed.preferredFilename = "renamed\(i % 4).txt" }
                _ = dir.fileWrappers?.count
            }
            kept.withLock { $0.append(contentsOf: mine) }
        }
        let children = try #require(dir.fileWrappers)
        let survivors = kept.withLock { $0 }
        #expect(children.count == survivors.count)
        let ids = Set(children.values.map(ObjectIdentifier.init))
        #expect(ids == Set(survivors.map(ObjectIdentifier.init)))
        for (key, child) in children {
            #expect(dir.keyForChildFileWrapper(child) == key)
            #expect(FileWrapper.preferredFilename(fromKey: key) == child.preferredFilename)
        }
    }
}

/// A value behind a mutex, for collecting results from threads; it holds only Sendable values,
/// so the compiler checks that it is Sendable.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R>(_ body: (inout Value) -> R) -> R {
        mutex.withLock { body(&$0) }
    }
}
