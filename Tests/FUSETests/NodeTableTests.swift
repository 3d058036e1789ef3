import FUSE
import Synchronization
import Testing

@Suite struct NodeTableTests {
    @Test func countsLookupsAndForgets() {
        let forgotten = Mutex<[String]>([])
        let table = NodeTable<String>(root: "/") { key, _ in forgotten.withLock { $0.append(key) } }
        #expect(table.node(for: "/") == .root)
        let (a, generation) = table.acquire("a")
        #expect(a != .root)
        #expect(generation == Generation(0))
        #expect(table.acquire("a").node == a)
        #expect(table.lookupCount(of: a) == 2)
        table.forget(a, lookups: 1)
        #expect(table.key(for: a) == "a")
        #expect(forgotten.withLock { $0 }.isEmpty)
        table.forget([ForgetItem(node: a, lookups: 1)])
        #expect(table.key(for: a) == nil)
        #expect(table.node(for: "a") == nil)
        #expect(forgotten.withLock { $0 } == ["a"])
    }

    @Test func reusedNodeIdsGetAHigherGeneration() throws {
        let table = NodeTable<Int>(root: 0)
        let (first, g0) = table.acquire(1)
        table.forget(first, lookups: 1)
        // Ids are reused within the table's shard of a key: some other key gets it.
        let reused = (2..<1000).lazy.map { ($0, table.acquire($0)) }.first { $0.1.node == first }
        let (key, (second, g1)) = try #require(reused)
        #expect(second == first)
        #expect(g1 > g0)
        #expect(table.key(for: second) == key)
    }

    @Test func rootIsPinnedAndOverForgetIsClamped() {
        let table = NodeTable<Int>(root: 0)
        table.forget(.root, lookups: 100)
        #expect(table.key(for: .root) == 0)
        let (node, _) = table.acquire(7)
        table.forget(node, lookups: 5)
        #expect(table.key(for: node) == nil)
        #expect(table.count == 1)
    }

    @Test func aRetiredKeyGetsANewNodeAndIsForgottenWithItsLast() {
        let forgotten = Mutex<[String]>([])
        let table = NodeTable<String>(root: "/") { key, _ in forgotten.withLock { $0.append(key) } }
        #expect(!table.retire("a"))
        let (old, _) = table.acquire("a")
        #expect(table.isCurrent(old))
        #expect(table.retire("a"))
        #expect(!table.isCurrent(old))
        // Until it is looked up again, the old node is the one to notify.
        #expect(table.node(for: "a") == old)
        let (new, _) = table.acquire("a")
        #expect(new != old)
        #expect(table.acquire("a").node == new)
        #expect(table.node(for: "a") == new)
        #expect(table.isCurrent(new))
        #expect(Set(table.nodes(for: "a")) == [old, new])
        // Both ids stand for the key while the kernel holds them.
        #expect(table.key(for: old) == "a")
        #expect(table.key(for: new) == "a")
        table.forget(old, lookups: 1)
        #expect(forgotten.withLock { $0 }.isEmpty)
        #expect(table.nodes(for: "a") == [new])
        table.forget(new, lookups: 2)
        #expect(forgotten.withLock { $0 } == ["a"])
        #expect(table.node(for: "a") == nil)
        #expect(table.count == 1)
        // A new node forgotten first leaves the key with its old one.
        let (first, _) = table.acquire("b")
        table.retire("b")
        let (second, _) = table.acquire("b")
        table.forget(second, lookups: 1)
        #expect(forgotten.withLock { $0 } == ["a"])
        #expect(table.node(for: "b") == first)
        table.forget(first, lookups: 1)
        #expect(forgotten.withLock { $0 } == ["a", "b"])
        #expect(!table.retire("/"))
    }
}
